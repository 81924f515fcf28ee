"""Verify a bundle on this host: its signature (when it has one or one is required), integrity,
then the environment diff, then optionally re-check accuracy and re-time the shipped engine
against the baseline.

The order is a safety rule: no engine is loaded (deserializing an engine runs native code)
before the signature (see :mod:`dossier.signing`) and every file have passed their checks. Engines are loaded in a child process, so an
engine that crashes this host's runtime is a finding, not a crash of ``verify``.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Sequence
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from dossier import confirmation
from dossier.backends import default_policy, requirement_findings
from dossier.bundle import Bundle, IntegrityReport, check_integrity
from dossier.bundle.integrity import scan_bundle
from dossier.errors import InputError, IntegrityError
from dossier.fingerprint import Fingerprint, collect
from dossier.hashing import BLAKE3
from dossier.policy import (
    Finding,
    Verdict,
    collapse,
    diff,
    load_policy,
    worst,
)
from dossier.signing import SignatureCheck, check_signature, signature_path
from dossier.timing import TimingSettings, flatten, summarize
from dossier.trial import Comparison, TimingSummary
from dossier.worker import WorkerRequest


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
    reason: str
    """What was compared and what it showed."""


class VerifyReport(_Model):
    """Everything ``dossier verify`` found."""

    bundle: str
    """Bundle path."""
    dossier_id: str
    """Its id."""
    release: str
    """NAME-VERSION."""
    backend: str
    """Compiler backend."""
    integrity: str
    """Integrity check result."""
    signature: str | None = None
    """Signature check result; None when the bundle is unsigned and no signature was required."""
    findings: list[Finding]
    """One per compared fingerprint field, worst first."""
    recheck: Recheck | None = None
    """Accuracy re-check, when asked for."""
    rebench: Rebench | None = None
    """Re-timing, when asked for."""
    verdict: Verdict
    """The worst of every finding, the re-check and the re-timing."""
    reasons: list[str]
    """Why the verdict is what it is, worst first."""


def _request(bundle: Bundle, work: Path, timing: TimingSettings, **kw: object) -> WorkerRequest:
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
        result = confirmation.confirm(baseline, others, timing, measure,
                                      fixed=max(timing.confirm_processes, 2))
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
    latency = (f"the shipped engine takes {ship_here.median_ms:.3f} ms "
               f"[{ship_here.ci_low_ms:.3f}, {ship_here.ci_high_ms:.3f}] here"
               + (f" (recorded {recorded.median_ms:.3f} ms)" if recorded else ""))
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
                   inside=inside, regression=bool(reasons), reason=reason)


def _names(group: Sequence[Finding], shown: int = 4) -> str:
    names = [f.field for f in group]
    return ", ".join(names[:shown]) + (f" and {len(names) - shown} more" if len(names) > shown
                                       else "")


def verify_bundle(bundle: Bundle, *, policy_file: Path | None = None, do_recheck: bool = False,
                  do_rebench: bool = False, threshold: float | None = None,
                  host: Fingerprint | None = None,
                  timing: TimingSettings | None = None,
                  trusted_keys: Sequence[Path] = (), require_signature: bool = False,
                  signature: Path | None = None,
                  signature_check: SignatureCheck | None = None,
                  integrity: IntegrityReport | None = None) -> VerifyReport:
    """The signature first (SignatureError: unsigned when ``require_signature``, not signed by
    one of ``trusted_keys``, or any file altered, missing or extra; a signature beside the
    bundle is checked even when not required), then integrity (IntegrityError names each bad
    file), then the environment diff, then the optional re-check and re-timing. ``host``
    replaces this host's fingerprint (for tests and for checking a fleet host's fingerprint
    file from elsewhere). ``signature_check`` and ``integrity`` are checks the caller already
    made (from one :func:`~dossier.bundle.integrity.scan_bundle`); without them every file is
    read once here, for both."""
    scan = None
    if signature_check is None:
        scan = scan_bundle(bundle, [BLAKE3] if require_signature or signature is not None
                           or os.path.lexists(signature_path(bundle.source)) else [])
        signature_check = check_signature(bundle, trusted_keys, require=require_signature,
                                          signature=signature, scan=scan)
    report = integrity if integrity is not None else check_integrity(bundle, scan)
    if not report:
        raise IntegrityError(f"{bundle.source}: {report}")
    m = bundle.manifest
    tuning_host = bundle.fingerprint()
    here = host or collect(include_compiler=tuning_host.compiler is not None)
    policy = default_policy(m.backend)
    if policy_file is not None:
        policy = load_policy(policy_file, policy)
    findings = [*requirement_findings(m.backend, here),
                *diff(tuning_host, here, policy, m.engines.shipped.flags)]
    verdicts = [f.verdict for f in findings]
    reasons = [f"{f.field}: {f.bundle_value} -> {f.host_value}: {f.reason}" if len(group) == 1
               else f"{len(group)} fields ({_names(group)}): {f.reason}"
               for group, f in collapse(findings)]
    checked = recheck(bundle, threshold=threshold) if do_recheck else None
    if checked is not None:
        verdicts.append(Verdict.VALID if checked.passed else Verdict.INVALID)
        if not checked.passed:
            reasons.insert(0, f"accuracy re-check failed: {checked.failure}")
    timed = rebench(bundle, timing) if do_rebench else None
    if timed is not None:
        verdicts.append(Verdict.SUBOPTIMAL if timed.regression else Verdict.VALID)
        if timed.regression:
            reasons.append(timed.reason)
    verdict = worst(verdicts)
    return VerifyReport(bundle=str(bundle.source), dossier_id=m.dossier_id, release=m.name,
                        backend=m.backend, integrity=str(report),
                        signature=str(signature_check) if signature_check else None,
                        findings=findings,
                        recheck=checked, rebench=timed, verdict=verdict, reasons=reasons)
