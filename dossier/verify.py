"""Verify a bundle on this host: one function, :func:`verify`, owns every step, in the safety
order: fetch (a registry reference is pulled into the cache), the signature (when the bundle
has one or one is required), integrity, the environment diff, then optionally re-check accuracy
and re-time the shipped engine against the baseline::

    from dossier.verify import VerifyOptions, verify

    report = verify("registry.example.com/ml/convnet:1",
                    VerifyOptions(require_signature=True, trusted_keys=[Path("keys/k.pub")]))
    print(report.verdict, [(s.name.value, s.outcome.value) for s in report.steps])

The order is a safety rule: no engine is loaded (deserializing an engine runs native code)
before the signature (see :mod:`dossier.signing`) and every file have passed their checks; the
signature and the integrity check share one read of every file. A refusal raises the typed error
(SignatureError, IntegrityError, BundleFormatError, a registry error...) whose exit code the CLI
uses; :func:`refused_report` gives the report of the steps up to the refusal. Engines are loaded
in a child process for ``recheck`` and ``rebench``, so an engine that crashes this host's runtime
is a finding, not a crash of ``verify``. :func:`verified` keeps the checked bundle open for a
loader (:func:`dossier.load`).

Steps that do not depend on each other overlap: when this host's fingerprint is to be collected
(no ``host`` given), it is collected in a background thread from the moment the bundle is open
while the signature and integrity checks read the bundle, and taken at the environment step;
``prepare_backend`` lets a loader do its own slow preparation (:func:`dossier.load` imports
the backend's runtime) meanwhile. None of it reads an engine.

Importing this module costs little (no numpy, no pyarrow, no backend): the environment step
imports the backend's policy, the re-check and re-timing the worker and the timing procedure.
"""

from __future__ import annotations

import contextlib
import enum
import importlib
import logging
import os
import stat
import tempfile
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict, Field

import dossier.bundle as _bundles
from dossier.bundle import Bundle
from dossier.bundle.integrity import BundleScan, scan_bundle
from dossier.bundle.manifest import FINGERPRINT_NAME
from dossier.conditions import Summary as ConditionsSummary
from dossier.errors import BundleError, DossierError, InputError, IntegrityError, SignatureError
from dossier.fingerprint import Fingerprint, collect, imported_now, load_fingerprint
from dossier.hashing import BLAKE3
from dossier.latency import RouteLatency
from dossier.policy import (
    Finding,
    Verdict,
    collapse,
    diff,
    load_policy,
    worst,
)
from dossier.sigfile import signature_path
from dossier.trial import Comparison, TimingSummary

if TYPE_CHECKING:
    from concurrent.futures import Future, ThreadPoolExecutor

    from dossier.registry.artifact import Pulled
    from dossier.signing import SignatureCheck
    from dossier.timing import TimingSettings
    from dossier.worker import WorkerRequest

logger = logging.getLogger(__name__)


class _Lazy:
    """A module imported on first use: the re-timing's procedure (:mod:`dossier.confirmation`)
    brings the validation-set readers (numpy, pyarrow), which verifying and loading do not
    need."""

    def __init__(self, name: str) -> None:
        self._name = name

    def __getattr__(self, attr: str) -> Any:
        return getattr(importlib.import_module(self._name), attr)


confirmation = _Lazy("dossier.confirmation")
_timing = _Lazy("dossier.timing")


def flatten(*args: Any, **kwargs: Any) -> Any:
    """:func:`dossier.timing.flatten` (imported when first called)."""
    return _timing.flatten(*args, **kwargs)


def summarize(*args: Any, **kwargs: Any) -> Any:
    """:func:`dossier.timing.summarize` (imported when first called)."""
    return _timing.summarize(*args, **kwargs)


class _Model(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class Recheck(_Model):
    """The bundle's validation set run through the shipped engine on this host."""

    passed: bool
    """Every loss of every pair below the threshold, no NaN/Inf."""
    metric: str
    """Loss metric."""
    threshold: float
    """Threshold applied (the bundle's, or a stricter one given to verify)."""
    failure: str | None
    """Which pair, which output, which loss, when it failed."""
    losses: dict[str, dict[str, float | None]] = Field(default_factory=dict)
    """Per pair, per output."""
    worst_loss: float | None = None
    """Largest loss."""
    recorded_worst_loss: float | None = None
    """The shipped route's largest loss on the tuning host."""


class Rebench(_Model):
    """The shipped engine and the baseline engine re-measured here with the confirmation's
    procedure (measuring processes of their own, each with the baseline, a second load of it
    and the shipped engine, production load options), judged by the speedup."""

    shipped: TimingSummary
    """The shipped engine's latency here."""
    baseline: TimingSummary
    """The baseline engine's latency here."""
    comparison: Comparison | None
    """Shipped against baseline here (None when the baseline itself ships)."""
    recorded_shipped: TimingSummary | None
    """The shipped engine's latency on the tuning host."""
    predicted_low: float | None = None
    """Lower end of the recorded prediction interval for a new process's reading (None in
    older bundles, which recorded none)."""
    predicted_high: float | None = None
    """Its upper end."""
    inside: bool | None = None
    """The speedup read here lies inside the recorded prediction interval (None without one,
    or when the baseline ships)."""
    regression: bool
    """The speedup here lies below the recorded prediction interval (older bundles: below the
    recorded interval), or its interval includes 1.0."""
    latency: RouteLatency | None = None
    """The shipped engine's latency per inference here (median, p90, p99, throughput)."""
    recorded_latency: RouteLatency | None = None
    """The same on the tuning host, as ``inspect`` shows it (the confirmation's reading)."""
    conditions: ConditionsSummary | None = None
    """What this host was doing during the re-measurement."""
    recorded_conditions: ConditionsSummary | None = None
    """What the tuning host was doing while the decision was measured (None: not recorded)."""
    reason: str
    """What was compared and what it showed."""


class StepName(str, enum.Enum):
    """The steps of a verification, in the order they run."""

    FETCH = "fetch"
    """A registry reference pulled into the cache (verified on arrival)."""
    SIGNATURE = "signature"
    """The DSSE envelope: signed by a trusted key, every file matching the signed statement."""
    INTEGRITY = "integrity"
    """Every file against the manifest's size and xxh3-128."""
    ENVIRONMENT = "environment"
    """This host's fingerprint against the tuning host's, a verdict per field."""
    RECHECK = "recheck"
    """The validation set through the shipped engine here."""
    REBENCH = "rebench"
    """The shipped and the baseline engines re-timed here."""


class Outcome(str, enum.Enum):
    """How a step ended."""

    PASSED = "passed"
    """Checked, and fit (VALID for a judged step)."""
    WARNED = "warned"
    """Checked: usable, but the tuning may no longer be the fastest (SUBOPTIMAL)."""
    FAILED = "failed"
    """Checked, and refused (INVALID, or an error that stops the verification)."""
    SKIPPED = "skipped"
    """Not run: not asked for, nothing to check, or an earlier step failed."""


class Step(_Model):
    """One step of a verification and what it found."""

    name: StepName
    """Which step."""
    outcome: Outcome
    """How it ended."""
    detail: str
    """One line: what was checked and what it showed (or why it was skipped)."""
    problems: list[str] = Field(default_factory=list)
    """Each problem found (e.g. every missing, extra or altered file), when it failed."""
    verdict: Verdict | None = None
    """For the environment, re-check and re-timing steps: their verdict."""


class VerifyReport(_Model):
    """Everything ``dossier verify`` found."""

    bundle: str
    """Bundle path (for a registry reference: its copy in the cache)."""
    dossier_id: str | None
    """Its id; None when the bundle could not be read."""
    release: str | None
    """NAME-VERSION; None when the bundle could not be read."""
    backend: str | None
    """Compiler backend; None when the bundle could not be read."""
    integrity: str | None
    """Integrity check result; None when it did not run."""
    signature: str | None = None
    """Signature check result; None when the bundle is unsigned and no signature was required."""
    findings: list[Finding] = Field(default_factory=list)
    """One per compared fingerprint field, worst first (empty with ``integrity_only``)."""
    recheck: Recheck | None = None
    """Accuracy re-check, when asked for."""
    rebench: Rebench | None = None
    """Re-timing, when asked for."""
    verdict: Verdict | None
    """The worst of every finding, the re-check and the re-timing; None when the environment
    was not judged (``integrity_only``, or a refusal before it)."""
    reasons: list[str] = Field(default_factory=list)
    """Why the verdict is what it is, worst first."""
    source: str = ""
    """What was asked for: a folder, an archive or a registry reference."""
    reference: str | None = None
    """For a registry reference: REGISTRY/REPO@sha256:... that was verified."""
    steps: list[Step] = Field(default_factory=list)
    """Every step in the order it ran, with its outcome."""
    exit_code: int = 0
    """The ``dossier verify`` exit code of this outcome (0 VALID or integrity only, 10, 11, or
    the refusal's code: 6, 13, 20...)."""
    error: str | None = None
    """The refusal, one line, when a step refused the bundle."""


def _request(bundle: Bundle, work: Path, timing: TimingSettings, **kw: object) -> WorkerRequest:
    from dossier.worker import WorkerRequest

    header = bundle.tuning_cache().header
    s = bundle.manifest.summary
    return WorkerRequest(backend=bundle.manifest.backend, model="",
                         validation=str(bundle.folder("validation")), metric=s.metric,
                         threshold=s.threshold, atol=s.atol, rtol=s.rtol, timing=timing,
                         baseline_route=s.baseline_route,
                         builder=header.builder, shapes=header.shapes,
                         result=str(work / "result.json"), stage=str(work / "stage"),
                         **kw)


def recheck(bundle: Bundle, *, threshold: float | None = None) -> Recheck:
    """Run the validation set through the shipped engine here, in a child process."""
    from dossier.child import run_child
    from dossier.worker import JudgedResult

    s = bundle.manifest.summary
    shipped = bundle.manifest.engines.shipped
    if not (bundle.folder("validation")).is_dir():
        raise InputError(f"{bundle.source} has no validation set (imported from trtexec?): "
                         "--recheck has nothing to run")
    limit = threshold if threshold is not None else s.threshold
    header = bundle.tuning_cache().header
    recorded = next((t.worst_loss for t in bundle.tuning_cache().trials
                     if t.index == shipped.trial_index), None)
    with tempfile.TemporaryDirectory(prefix="dossier-verify-") as tmp:
        req = _request(bundle, Path(tmp), header.timing, mode="validate",
                       engine=str(bundle.file(shipped.path)), route=shipped.route)
        req = req.model_copy(update={"threshold": limit})
        result = run_child(req, Path(tmp), "recheck", header.timing.trial_timeout_s,
                           header.timing.trial_memory_limit_mb,
                           _loader_env(bundle, bundle.file(shipped.path)))
    if not isinstance(result, JudgedResult):
        failure = getattr(result, "reason", None) or "the engine did not run"
        return Recheck(passed=False, metric=s.metric, threshold=limit, failure=failure,
                       recorded_worst_loss=recorded)
    return Recheck(passed=result.outcome == "ok", metric=s.metric, threshold=limit,
                   failure=result.reason, losses=result.losses, worst_loss=result.worst_loss,
                   recorded_worst_loss=recorded)


def _loader_env(bundle: Bundle, *engines: Path) -> dict[str, str]:
    """What the child that loads ``engines`` needs in its environment (backend-specific)."""
    from dossier.backends import get_backend

    try:
        backend = get_backend(bundle.manifest.backend)
    except InputError:
        return {}
    return backend.loader_env(*engines)


def _interval(x: float, lo: float, hi: float) -> str:
    return f"{x:.3f}x [{lo:.3f}, {hi:.3f}]"


def judge_speedup(here: Comparison | None, recorded: float | None, low: float | None,
                  high: float | None) -> list[str]:
    """Why a re-measured speedup is a regression against the recorded one (empty: it is not):
    it lies below ``low`` (the recorded prediction interval's lower end; in older bundles the
    recorded interval's, whose upper end its interval had to reach), or its interval no longer
    excludes 1.0."""
    if here is None or recorded is None or low is None or high is None:
        return []
    now = _interval(here.speedup, here.speedup_ci_low, here.speedup_ci_high)
    was = _interval(recorded, low, high)
    below = here.speedup < low if here.processes else here.speedup_ci_high < low
    if below:
        return [f"its speedup over the baseline fell to {now}, below the recorded {was}"]
    if here.speedup_ci_low <= 1.0:
        return [f"its speedup over the baseline here, {now}, no longer excludes 1.0 "
                f"(recorded {was})"]
    return []


def rebench(bundle: Bundle, timing: TimingSettings | None = None) -> Rebench:
    """Re-measure the shipped and the baseline engines here with the confirmation's procedure
    (:mod:`dossier.confirmation`, ``confirm_processes`` measuring processes, production load
    options) and judge the shipped route by whether its speedup falls inside the prediction
    interval the confirmation recorded for a new process. Absolute latency is reported, not
    judged (it depends on the host)."""
    m = bundle.manifest
    cache = bundle.tuning_cache()
    timing = timing or cache.header.timing
    shipped, base = m.engines.shipped, m.engines.baseline
    if base is None:
        raise InputError(f"{bundle.source} has no baseline engine (imported from trtexec?): "
                         "--rebench cannot compare against the baseline")
    if not (bundle.folder("validation")).is_dir():
        raise InputError(f"{bundle.source} has no validation set to time the engines on")
    same = shipped.trial_index == base.trial_index
    baseline = (bundle.file(base.path), base.route)
    others = [] if same else [(bundle.file(shipped.path), shipped.route)]
    with tempfile.TemporaryDirectory(prefix="dossier-rebench-") as work:
        measure = confirmation.local_processes(
            m.backend, bundle.path / "validation", timing, builder=cache.header.builder,
            shapes=cache.header.shapes, work=Path(work),
            env=_loader_env(bundle, baseline[0], *(e for e, _ in others)))
        # the baseline shipping: no speedup to judge, only its latency (two processes do)
        result = confirmation.confirm(baseline, others, timing, measure,
                                      fixed=2 if same else max(timing.confirm_processes, 2))
    base_s = flatten(result.aa.baseline)[0]
    base_here = summarize(base_s, timing.confidence, result.aa.warmup_runs)
    track = result.candidates[0] if others else None
    ship_here = base_here if track is None else summarize(
        flatten(track.samples)[0], timing.confidence, track.warmup_runs)
    comp = track.comparison if track is not None else None
    recorded_trials = [t for t in cache.trials if t.route == shipped.route and t.timing]
    recorded = recorded_trials[-1].timing if recorded_trials else None
    confirmed = [t.comparison for t in cache.trials if t.role == "confirm"
                 and t.route == shipped.route and t.comparison is not None]
    rec = confirmed[-1] if confirmed else None
    s = m.summary
    p_lo = rec.prediction_low if rec is not None else None
    p_hi = rec.prediction_high if rec is not None else None
    from dossier.bundle.overview import decision_conditions
    from dossier.conditions import summarize as summarize_conditions
    from dossier.latency import of_route, per_inference

    pairs = m.summary.validation_pairs
    lat_here = per_inference(base_s if track is None else flatten(track.samples)[0], pairs,
                             route=shipped.route, source="confirmation", trial_index=-1)
    lat_then = of_route(cache.trials, shipped.route, m.summary.baseline_route, pairs)
    cond_here = summarize_conditions(result.conditions)
    cond_then, _ = decision_conditions(list(cache.trials))
    latency = ((f"the shipped engine takes {lat_here.median_ms:.4g} ms per inference here "
                f"(p99 {lat_here.p99_ms:.4g} ms)" if lat_here is not None else
                "the shipped engine was not timed here")
               + (f" (recorded {lat_then.median_ms:.4g} ms per inference, "
                  f"{'confirmation' if lat_then.source == 'confirmation' else 'screening only'})"
                  if lat_then is not None else ""))
    if cond_here is not None and cond_then is not None and \
            (cond_here.busy > 0) != (cond_then.busy > 0):
        latency += (f"; measured on a {'busy' if cond_here.busy else 'quiet'} host here, a "
                    f"{'busy' if cond_then.busy else 'quiet'} one when tuned: not like with like")
    if p_lo is not None and p_hi is not None and s.speedup is not None:
        reasons = judge_speedup(comp, s.speedup, p_lo, p_hi)
    else:
        reasons = judge_speedup(comp, s.speedup, s.speedup_ci_low, s.speedup_ci_high)
    inside = (None if comp is None or p_lo is None or p_hi is None
              else p_lo <= comp.speedup <= p_hi)
    if comp is None:
        verdict = "the baseline ships: nothing to compare"
    else:
        verdict = (f"{_interval(comp.speedup, comp.speedup_ci_low, comp.speedup_ci_high)} the "
                   f"baseline ({comp.processes} measuring processes)"
                   + ("" if p_lo is None or p_hi is None else
                      f", {'inside' if inside else 'outside'} the recorded prediction interval "
                      f"[{p_lo:.3f}, {p_hi:.3f}] for a new process")
                   + ("" if s.speedup is None or s.speedup_ci_low is None
                      or s.speedup_ci_high is None else
                      f", recorded {_interval(s.speedup, s.speedup_ci_low, s.speedup_ci_high)}"))
    reason = ("regression: " + "; ".join(reasons) + f"; {latency}" if reasons
              else f"{verdict}; {latency}; no regression")
    return Rebench(shipped=ship_here, baseline=base_here, comparison=comp,
                   recorded_shipped=recorded, predicted_low=p_lo, predicted_high=p_hi,
                   inside=inside, regression=bool(reasons), reason=reason, latency=lat_here,
                   recorded_latency=lat_then, conditions=cond_here,
                   recorded_conditions=cond_then)


def _compiler_recorded(bundle: Bundle) -> bool | None:
    """Whether the bundle's tuning host recorded a C++ compiler (then this host's is probed
    too), read ahead of the checks to start collecting this host's fingerprint early. None when
    that cannot be told safely before the checks: an archive read lazily (reading would extract
    a member), or a fingerprint.json that is not a regular file of its recorded size, or does
    not parse. The environment step decides again on the checked file, and collects anew if
    the two disagree."""
    entry = bundle.manifest.table().get(FINGERPRINT_NAME)
    if bundle.archive is not None or entry is None:
        return None
    flags = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0)
    try:
        with open(os.open(bundle.path / FINGERPRINT_NAME, flags), "rb") as f:
            info = os.fstat(f.fileno())
            if not stat.S_ISREG(info.st_mode) or info.st_size != entry.size:
                return None
            return Fingerprint.model_validate_json(f.read(entry.size + 1)).compiler is not None
    except (OSError, ValueError):  # a pydantic ValidationError is a ValueError
        return None


def _names(group: Sequence[Finding], shown: int = 4) -> str:
    names = [f.field for f in group]
    return ", ".join(names[:shown]) + (f" and {len(names) - shown} more" if len(names) > shown
                                       else "")


@dataclass(frozen=True)
class VerifyOptions:
    """What :func:`verify` checks, and against what."""

    integrity_only: bool = False
    """Stop after the integrity check (no environment verdict)."""
    recheck: bool = False
    """Run the validation set through the shipped engine here."""
    rebench: bool = False
    """Re-time the shipped and the baseline engines here."""
    threshold: float | None = None
    """With ``recheck``: a threshold at or below the bundle's (a looser one is InputError)."""
    policy: Path | None = None
    """TOML policy file whose rules come before the backend's defaults."""
    host: Fingerprint | Path | None = None
    """Judge this fingerprint (or fingerprint file) instead of this host's."""
    trusted_keys: Sequence[Path] = ()
    """Ed25519 public keys (PEM) whose signature is accepted."""
    require_signature: bool = False
    """Refuse a bundle that is not signed by one of ``trusted_keys``."""
    signature: Path | None = None
    """The signature file (default: ``NAME-VERSION.dossier.sig.json`` beside the bundle; for
    a registry reference, its signature referrers)."""
    insecure: bool = False
    """For a registry reference: plain HTTP, allowed only for a loopback registry."""
    registry_cache: Path | None = None
    """Where registry references are pulled (default :func:`dossier.registry.cache_dir`)."""
    timing: TimingSettings | None = None
    """With ``rebench``: timing settings instead of the bundle's."""
    extract: bool = False
    """Extract an archive whole, every file checked as it is written (what a loader needs:
    the engine it loads is the one that was checked). Otherwise an archive is read in place
    as far as the checks need."""
    workdir: Path | None = None
    """Where an archive is extracted (default: the system's temporary folder)."""
    prepare_backend: Callable[[str], object] | None = None
    """Called once, in the calling thread, with the manifest's backend name (e.g.
    ``"torch-inductor"``) as soon as the bundle is open: after this host's fingerprint has
    started to be collected in the background and before the signature and integrity checks,
    so that what it does overlaps with them. :func:`dossier.load` imports the backend's
    runtime there (:meth:`dossier.backends.Backend.import_runtime`: ``import torch`` takes
    seconds). It is given the name alone, never the bundle, so nothing it does can read an
    engine before the checks and the verdict have passed; it runs whether or not they then
    refuse the bundle (it ran before they did). An exception it raises ends the verification
    as one raised by the checks would (a DossierError as a refusal, with its report);
    :func:`dossier.load`'s raises none."""


StepObserver = Callable[[Step], None]
"""Called with every step as it ends (the CLI prints its OK/FAIL lines from these)."""

_SIGNATURE_DIGESTS = (BLAKE3,)
"""What a signature check needs of every file, computed in the same read as xxh3-128."""
_REPORT_ATTR = "verify_report"


def verify(source: str | os.PathLike[str], options: VerifyOptions | None = None, *,
           on_step: StepObserver | None = None) -> VerifyReport:
    """Verify the bundle at ``source`` (a folder, a ``.dossier.tar`` or a registry reference
    ``REGISTRY/REPO:TAG`` / ``REGISTRY/REPO@sha256:...``) on this host.

    The steps run in the safety order: fetch, signature, integrity, environment, recheck,
    rebench. Returns the report (its ``verdict`` VALID, SUBOPTIMAL or INVALID, or None with
    ``integrity_only``). Raises, after the failed step was reported: SignatureError (exit 13),
    IntegrityError or another BundleError (exit 6), the registry's errors (20, 21, 22),
    InputError (3: a bad policy file, a re-check of a bundle without a validation set),
    DiskFullError (74: no room to extract an archive). :func:`refused_report` of the error
    gives the report up to that step.
    """
    with verified(source, options, on_step=on_step) as (_, report):
        return report


@contextlib.contextmanager
def verified(source: str | os.PathLike[str], options: VerifyOptions | None = None, *,
             on_step: StepObserver | None = None) -> Iterator[tuple[Bundle, VerifyReport]]:
    """:func:`verify`, with the checked bundle kept open for the ``with`` block (an archive's
    temporary folder is removed afterwards). Errors raised inside the block are the caller's
    and are not reported as a step."""
    run = _Run(str(source), options or VerifyOptions(), on_step)
    with contextlib.ExitStack() as stack:
        try:
            bundle = stack.enter_context(run.open())
            report = run.checks(bundle)
        except DossierError as exc:
            raise run.refused(exc) from None
        yield bundle, report


def refused_report(exc: BaseException) -> VerifyReport | None:
    """The report of the steps up to a refusal raised by :func:`verify` (None for an error
    that did not come from it)."""
    report = getattr(exc, _REPORT_ATTR, None)
    return report if isinstance(report, VerifyReport) else None


def with_report(exc: DossierError, report: VerifyReport) -> DossierError:
    """``exc`` carrying ``report`` (what :func:`refused_report` returns): for a refusal made
    on a finished report, e.g. :func:`dossier.load` refusing an INVALID verdict."""
    setattr(exc, _REPORT_ATTR, report)
    return exc


def verify_bundle(bundle: Bundle, *, policy_file: Path | None = None, do_recheck: bool = False,
                  do_rebench: bool = False, threshold: float | None = None,
                  host: Fingerprint | None = None,
                  timing: TimingSettings | None = None,
                  trusted_keys: Sequence[Path] = (), require_signature: bool = False,
                  signature: Path | None = None) -> VerifyReport:
    """The steps of :func:`verify` after the fetch, for a bundle already opened (kept for
    callers of earlier versions)."""
    opts = VerifyOptions(recheck=do_recheck, rebench=do_rebench, threshold=threshold,
                         policy=policy_file, host=host, timing=timing,
                         trusted_keys=tuple(trusted_keys), require_signature=require_signature,
                         signature=signature)
    run = _Run(str(bundle.source), opts, None)
    run.path = bundle.source
    try:
        return run.checks(bundle)
    except DossierError as exc:
        raise run.refused(exc) from None


class _Run:
    """One verification: the steps so far and what they found."""

    def __init__(self, source: str, opts: VerifyOptions, on_step: StepObserver | None) -> None:
        self.source, self.opts, self.on_step = source, opts, on_step
        self.path = Path(source)
        self.steps: list[Step] = []
        self.current = StepName.FETCH
        self.fetched: Pulled | None = None
        self.bundle: Bundle | None = None
        self.signed: SignatureCheck | None = None
        self.signature_checked = False
        self.integrity: str | None = None
        self.imported: dict[str, object] = {}
        """What the caller had imported when the checks began (what the fingerprint reads)."""
        self.host_future: Future[Fingerprint] | None = None
        """This host's fingerprint, being collected in the background."""
        self.host_compiler: bool | None = None
        """The ``include_compiler`` it is being collected with."""

    # --------------------------------------------------------------------------- steps
    def _step(self, name: StepName, outcome: Outcome, detail: str, *,
              problems: Sequence[str] = (), verdict: Verdict | None = None) -> None:
        step = Step(name=name, outcome=outcome, detail=detail, problems=list(problems),
                    verdict=verdict)
        self.steps.append(step)
        logger.info("verify %s: %s: %s %s", self.source, name.value, outcome.value, detail)
        if self.on_step is not None:
            self.on_step(step)

    def _skip(self, name: StepName, why: str) -> None:
        self._step(name, Outcome.SKIPPED, why)

    @contextlib.contextmanager
    def open(self) -> Iterator[Bundle]:
        """Fetch a registry reference, then open the bundle as the signature check needs it."""
        self._fetch()
        o = self.opts
        self.current = StepName.SIGNATURE
        # an archive is read in place as far as the checks read it; but a signed one whose
        # files are used after the check (engines loaded, the environment read) is extracted
        # whole first, so what the signature covered is what is used
        signed_here = (o.require_signature or o.signature is not None
                       or os.path.lexists(signature_path(self.path)))
        lazy = not o.extract and (o.integrity_only or not signed_here)
        with _bundles.open_bundle(self.path, lazy=lazy, digests=self._digests(self.path),
                                  workdir=o.workdir) as bundle:
            yield bundle

    def _fetch(self) -> None:
        if os.path.lexists(self.source):  # a local bundle: the registry client is not imported
            self._skip(StepName.FETCH, f"{self.source}: a local bundle")
            return
        from dossier.registry.source import fetch_reference

        fetched = fetch_reference(self.source, insecure=self.opts.insecure,
                                  cache=self.opts.registry_cache,
                                  require_signature=self.opts.require_signature)
        if fetched is None:  # neither a path nor a reference: opening it says what it is not
            self._skip(StepName.FETCH, f"{self.source}: not a registry reference")
            return
        self.fetched, self.path = fetched, fetched.path
        self._step(StepName.FETCH, Outcome.WARNED if fetched.warnings else Outcome.PASSED,
                   f"{fetched.reference}: "
                   f"{'in the cache at' if fetched.cached else 'pulled into'} {fetched.path}, "
                   f"{len(fetched.signatures)} signature referrer(s)",
                   problems=[f"ignored: {w}" for w in fetched.warnings])

    def checks(self, bundle: Bundle) -> VerifyReport:
        """Signature, integrity, then (unless integrity only) the environment and the optional
        re-check and re-timing; this host's fingerprint collected meanwhile, and
        ``prepare_backend`` called before the checks. When this returns or raises, no thread
        of the verification is left running."""
        self.bundle = bundle
        self.current = StepName.SIGNATURE
        self.imported = imported_now()  # before anything the verification imports itself
        pool = self._collect_host(bundle)
        try:
            if self.opts.prepare_backend is not None:
                self.opts.prepare_backend(bundle.manifest.backend)
            return self._checks(bundle)
        finally:
            self.host_future = None
            if pool is not None:  # a refusal before the environment step: not taken
                pool.shutdown(wait=True, cancel_futures=True)

    def _collect_host(self, bundle: Bundle) -> ThreadPoolExecutor | None:
        """Start collecting this host's fingerprint in a background thread, when the
        environment step will need it and the bundle's tuning host says (safely, ahead of the
        checks) whether the compiler is to be probed; the pool that runs it, or None."""
        o = self.opts
        if o.host is not None or o.integrity_only:
            return None
        include = _compiler_recorded(bundle)
        if include is None:
            return None
        from concurrent.futures import ThreadPoolExecutor

        pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="dossier-fingerprint")
        self.host_future = pool.submit(collect, include_compiler=include, imported=self.imported)
        self.host_compiler = include
        return pool

    def _host_here(self, tuning_host: Fingerprint) -> Fingerprint:
        """This host's fingerprint: the one collected in the background when it was started
        with what the checked tuning host asks for, else collected now. Either way collected
        with the modules the caller had imported when the checks began."""
        include = tuning_host.compiler is not None
        future, self.host_future = self.host_future, None
        if future is not None and self.host_compiler is include:
            return future.result()  # what the collection raised, raised here
        return collect(include_compiler=include, imported=self.imported)

    def _checks(self, bundle: Bundle) -> VerifyReport:
        o = self.opts
        scan = scan_bundle(bundle, self._digests(bundle.source))  # one read of every file
        self.signed = self._signature(bundle, scan)
        self.signature_checked = True
        if self.signed is not None:
            self._step(StepName.SIGNATURE, Outcome.PASSED,
                       f"signature {self.signed.path}: {self.signed}")
        else:
            self._skip(StepName.SIGNATURE, "the bundle is not signed and no signature was "
                       "required")
        self.current = StepName.INTEGRITY
        report = _bundles.check_integrity(bundle, scan)
        if not report:
            problems = [str(p) for p in report.problems] or [str(report)]
            self._step(StepName.INTEGRITY, Outcome.FAILED,
                       f"{self.path}: integrity check failed ({len(report.problems)} problem(s))",
                       problems=problems)
            raise IntegrityError(f"{self.path}: {report}")
        self.integrity = str(report)
        self._step(StepName.INTEGRITY, Outcome.PASSED,
                   f"{bundle.manifest.name} ({self.path}): {report}")
        if o.integrity_only:
            for name in (StepName.ENVIRONMENT, StepName.RECHECK, StepName.REBENCH):
                self._skip(name, "integrity only")
            return self._report()
        recorded = bundle.manifest.summary.threshold
        if o.recheck and o.threshold is not None and o.threshold > recorded:
            # a re-check may only ask more of the engine than its release did
            self.current = StepName.RECHECK
            raise InputError(f"--threshold {o.threshold:g} is looser than the bundle's "
                             f"{recorded:g}", hint="a re-check takes the bundle's threshold or "
                             "a stricter (lower) one")
        return self._judge(bundle)

    def _digests(self, source: Path) -> list[str]:
        """What the signature check needs besides xxh3-128: its digests when a signature is
        checked (one beside the bundle, one named, one required, or registry referrers)."""
        o = self.opts
        signed = (o.require_signature or o.signature is not None
                  or os.path.lexists(signature_path(source))
                  or (self.fetched is not None and bool(self.fetched.signatures)))
        return list(_SIGNATURE_DIGESTS) if signed else []

    def _signature(self, bundle: Bundle, scan: BundleScan) -> SignatureCheck | None:
        o = self.opts
        if self.fetched is not None and o.signature is None:
            from dossier.registry import check_referrer_signatures

            return check_referrer_signatures(bundle, self.fetched.signatures, o.trusted_keys,
                                             require=o.require_signature,
                                             source=self.fetched.reference, scan=scan)
        if (o.require_signature or o.signature is not None or o.trusted_keys
                or os.path.lexists(signature_path(bundle.source))):
            from dossier.signing import check_signature

            return check_signature(bundle, o.trusted_keys, require=o.require_signature,
                                   signature=o.signature, scan=scan)
        return None  # no signature and no key to check one with: dossier.signing not imported

    def _judge(self, bundle: Bundle) -> VerifyReport:
        from dossier.backends import default_policy, requirement_findings

        o = self.opts
        self.current = StepName.ENVIRONMENT
        m = bundle.manifest
        tuning_host = bundle.fingerprint()
        if isinstance(o.host, Fingerprint):
            here = o.host
        elif o.host is not None:
            here = load_fingerprint(o.host)
        else:
            here = self._host_here(tuning_host)
        policy = default_policy(m.backend)
        if o.policy is not None:
            policy = load_policy(o.policy, policy)
        findings = [*requirement_findings(m.backend, here),
                    *diff(tuning_host, here, policy, m.engines.shipped.flags)]
        reasons = [f"{f.field}: {f.bundle_value} -> {f.host_value}: {f.reason}" if len(group) == 1
                   else f"{len(group)} fields ({_names(group)}): {f.reason}"
                   for group, f in collapse(findings)]
        env = worst(f.verdict for f in findings) if findings else Verdict.VALID
        changed = sum(1 for f in findings if f.changed)
        self._step(StepName.ENVIRONMENT, _OUTCOME[env],
                   f"{len(findings)} fields compared, {changed} changed: {env.value}"
                   + (f" ({reasons[0]})" if reasons and env is not Verdict.VALID else ""),
                   verdict=env)
        verdicts = [f.verdict for f in findings]
        checked = None
        self.current = StepName.RECHECK
        if o.recheck:
            checked = recheck(bundle, threshold=o.threshold)
            verdicts.append(Verdict.VALID if checked.passed else Verdict.INVALID)
            if not checked.passed:
                reasons.insert(0, f"accuracy re-check failed: {checked.failure}")
            worst_loss = "-" if checked.worst_loss is None else f"{checked.worst_loss:.3g}"
            self._step(StepName.RECHECK, Outcome.PASSED if checked.passed else Outcome.FAILED,
                       f"worst {checked.metric} loss {worst_loss} (threshold "
                       f"{checked.threshold:.3g})"
                       + (f": {checked.failure}" if checked.failure else ""),
                       verdict=verdicts[-1])
        else:
            self._skip(StepName.RECHECK, "not asked for")
        timed = None
        self.current = StepName.REBENCH
        if o.rebench:
            timed = rebench(bundle, o.timing)
            verdicts.append(Verdict.SUBOPTIMAL if timed.regression else Verdict.VALID)
            if timed.regression:
                reasons.append(timed.reason)
            self._step(StepName.REBENCH, Outcome.WARNED if timed.regression else Outcome.PASSED,
                       timed.reason, verdict=verdicts[-1])
        else:
            self._skip(StepName.REBENCH, "not asked for")
        verdict = worst(verdicts) if verdicts else Verdict.VALID
        return self._report(findings=findings, recheck=checked, rebench=timed, verdict=verdict,
                            reasons=reasons, exit_code=int(verdict.exit_code))

    # --------------------------------------------------------------------------- reports
    def _report(self, **judged: Any) -> VerifyReport:
        m = self.bundle.manifest if self.bundle is not None else None
        fields: dict[str, Any] = {"verdict": None, **judged}
        return VerifyReport(
            bundle=str(self.path), dossier_id=m.dossier_id if m else None,
            release=m.name if m else None, backend=m.backend if m else None,
            integrity=self.integrity,
            signature=str(self.signed) if self.signed is not None else None,
            source=self.source, reference=self.fetched.reference if self.fetched else None,
            steps=list(self.steps), **fields)

    def refused(self, exc: DossierError) -> DossierError:
        """``exc`` with the report of the steps so far; the failed step reported, and the
        steps after it skipped."""
        if (isinstance(exc, BundleError) and self.opts.require_signature
                and not self.signature_checked and self.current is StepName.SIGNATURE):
            # a bundle that cannot even be opened (a corrupt manifest.json) while a signature
            # is required: what its signature says about it comes before the format error
            from dossier.signing import check_signature_at

            try:
                check_signature_at(self.path, self.opts.trusted_keys, require=True,
                                   signature=self.opts.signature)
            except DossierError as signature_error:
                exc = signature_error
        if not self.steps or self.steps[-1].outcome is not Outcome.FAILED:
            name = self.current
            if name is StepName.SIGNATURE and not isinstance(exc, SignatureError):
                name = StepName.INTEGRITY  # the bundle could not be opened or read
            self._step(name, Outcome.FAILED, exc.diagnostics())
        failed = self.steps[-1].name
        done = {s.name for s in self.steps}
        for name in StepName:
            if name not in done:
                self._skip(name, f"not run: the {failed.value} step failed")
        order = list(StepName)
        self.steps.sort(key=lambda s: order.index(s.name))
        return with_report(exc, self._report(exit_code=int(exc.exit_code),
                                             error=exc.diagnostics()))


_OUTCOME = {Verdict.VALID: Outcome.PASSED, Verdict.SUBOPTIMAL: Outcome.WARNED,
            Verdict.INVALID: Outcome.FAILED}


__all__ = ["Outcome", "Rebench", "Recheck", "Step", "StepName", "StepObserver",
           "VerifyOptions", "VerifyReport", "judge_speedup", "rebench", "recheck",
           "refused_report", "verified", "verify", "verify_bundle", "with_report"]
