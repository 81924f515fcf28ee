"""Verify a bundle on this host: one function, :func:`verify`, owns every step, in the safety
order: fetch (a registry reference is pulled into the cache), the signature (when the bundle
has one or one is required), integrity, the environment diff, then optionally re-check accuracy
and re-time the shipped engine against the baseline::

    from dossier.verify import VerifyOptions, verify

    report = verify("registry.example.com/ml/convnet:1",
                    VerifyOptions(require_signature=True, trusted_keys=[Path("keys/k.pub")]))
    print(report.verdict, [(s.name.value, s.outcome.value) for s in report.steps])

The order is a safety rule: no engine is loaded (deserializing an engine runs native code)
before the signature (see :mod:`dossier.trust.signing`) and every file have passed their checks; the
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
the backend's runtime) meanwhile. None of it reads an engine. The bundle's backend is resolved
once per verification: the instance handed to ``prepare_backend`` is the one whose policy and
requirements the environment step applies.

Importing this module costs little (no numpy, no pyarrow, no backend): the environment step
imports the backend's policy, the re-check and re-timing the worker and the timing procedure.
"""
from __future__ import annotations

import contextlib
import logging
import os
import stat
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import dossier.bundle as _bundles
from dossier.bundle import Bundle
from dossier.bundle.integrity import BundleScan, scan_bundle
from dossier.bundle.manifest import Manifest
from dossier.errors import (
    BackendUnavailableError,
    BundleError,
    DossierError,
    InputError,
    IntegrityError,
    SelectionError,
    SignatureError,
)
from dossier.fingerprint import Fingerprint, collect, imported_now, load_fingerprint
from dossier.hashing import BLAKE3
from dossier.host.policy import (
    Finding,
    Policy,
    Verdict,
    collapse,
    diff,
    load_policy,
    worst,
)
from dossier.run_folder import FINGERPRINT_NAME, KNOBS_NAME
from dossier.trust.sigfile import signature_path

if TYPE_CHECKING:
    from concurrent.futures import Future, ThreadPoolExecutor

    from dossier.backends.interface import Backend
    from dossier.measure.timing import TimingSettings
    from dossier.registry.artifact import Pulled
    from dossier.trust.signing import SignatureCheck

from dossier.verify.host import REBENCH_MAX_S, RECHECK_MAX_S, has_holdout, rebench, recheck
from dossier.verify.report import Step, StepName, StepOutcome, VerifyReport

logger = logging.getLogger(__name__)


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
    rebench_max_s: float = REBENCH_MAX_S
    """With ``rebench``: about the most seconds its measuring processes take together."""
    recheck_max_s: float = RECHECK_MAX_S
    """With ``recheck``: the most seconds each re-check's process may take (the validation
    set, then the hold-out set)."""
    extract: bool = False
    """Extract an archive whole, every file checked as it is written (what a loader needs:
    the engine it loads is the one that was checked). Otherwise an archive is read in place
    as far as the checks need."""
    workdir: Path | None = None
    """Where an archive is extracted (default: the system's temporary folder)."""
    read_validation: bool = True
    """With ``extract``: the caller reads the validation set's files after the checks
    (``dossier run``); without, a folder's private copy leaves them out (hashed in place)."""
    rebench_scenario: Callable[[Any], Any] | None = None
    """With ``rebench``: how a bundle released under a server or offline scenario has its
    scenario replayed (``dossier.scenarios.replay.rebench_scenario``, which the CLI passes;
    None: the speedup is re-measured, the scenario is not)."""
    check_records: bool = True
    """Cross-check the bundle's data-set records against its search record and the files
    present (:mod:`dossier.verify.data_sets`). ``dossier.load`` leaves it out: every file it
    serves from is hashed, and a loader reads no search record (nor imports its readers)."""
    prepare_backend: Callable[[Backend], object] | None = None
    """Called once, in the calling thread, with the bundle's backend (the instance of the
    backend the manifest names, e.g. ``torch-inductor``: the one whose policy and
    requirements the environment step then applies) as soon as the bundle is open: after this
    host's fingerprint has started to be collected in the background and before the signature
    and integrity checks, so that what it does overlaps with them. :func:`dossier.load` keeps
    the instance to load the engine with, and imports its runtime there
    (:meth:`dossier.backends.Backend.import_runtime`: ``import torch`` takes seconds). It is
    given the backend alone, never the bundle, so nothing it does can read an engine before
    the checks and the verdict have passed; it runs whether or not they then refuse the bundle
    (it ran before they did). Not called for a backend that is not known here (the
    environment step refuses it) or whose package fails to import (the environment step
    raises that, after the checks). An exception it raises ends the verification as one
    raised by the checks would (a DossierError as a refusal, with its report);
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
        self.ignored: list[str] = []
        """Signature referrers that did not pass, ignored (no signature was required)."""
        self.integrity: str | None = None
        self.imported: dict[str, object] = {}
        """What the caller had imported when the checks began (what the fingerprint reads)."""
        self.host_future: Future[Fingerprint] | None = None
        """This host's fingerprint, being collected in the background."""
        self.host_compiler: bool | None = None
        """The ``include_compiler`` it is being collected with."""
        self.backend: Backend | None = None
        """The bundle's backend, once resolved (:meth:`_backend`)."""
        self.backend_resolved = False

    # --------------------------------------------------------------------------- steps
    def _step(self, name: StepName, outcome: StepOutcome, detail: str, *,
              problems: Sequence[str] = (), verdict: Verdict | None = None) -> None:
        step = Step(name=name, outcome=outcome, detail=detail, problems=list(problems),
                    verdict=verdict)
        self.steps.append(step)
        logger.info("verify %s: %s: %s %s", self.source, name.value, outcome.value, detail)
        if self.on_step is not None:
            self.on_step(step)

    def _skip(self, name: StepName, why: str) -> None:
        self._step(name, StepOutcome.SKIPPED, why)

    @contextlib.contextmanager
    def open(self) -> Iterator[Bundle]:
        """Fetch a registry reference, then open the bundle as the signature check needs it."""
        self._fetch()
        o = self.opts
        self.current = StepName.SIGNATURE
        # an archive is read in place as far as the checks read it; but a signed one whose
        # files are used after the check (engines loaded, the environment read) is extracted
        # whole first, so what the signature covered is what is used
        lazy = not o.extract and (o.integrity_only or not self._signature_involved())
        # a folder whose engines are loaded after the checks (a loader, a re-check, a
        # re-timing) is copied into a private folder, each file hashed as it is copied: what
        # is loaded is what was checked, whatever another process does to the folder
        private = not o.integrity_only and (o.extract or o.recheck or o.rebench)
        with _bundles.open_bundle(self.path, lazy=lazy, digests=self._digests(),
                                  workdir=o.workdir, private=private,
                                  unused=self._unused) as bundle:
            yield bundle

    def _unused(self, manifest: Manifest) -> set[str]:
        """What no step after the checks reads, so a private copy need not hold it: the
        model, the knob database and the tables; the baseline engine unless it is re-timed."""
        table = manifest.table()
        unused = {rel for rel in table if rel.startswith("model/")
                  or rel in (KNOBS_NAME, "routes.parquet", "timings.parquet", "shapes.parquet")}
        base, shipped = manifest.engines.baseline, manifest.engines.shipped
        if base is not None and base.path != shipped.path and not self.opts.rebench:
            unused.add(base.path)
        o = self.opts
        if not (o.read_validation or o.recheck or o.rebench):
            unused.update(rel for rel in table if rel.startswith("validation/"))
        # no step reads the calibration set; the hold-out set only a re-check
        unused.update(rel for rel in table if rel.startswith("calibration/")
                      or (rel.startswith("holdout/") and not o.recheck))
        return unused

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
        self._step(StepName.FETCH, StepOutcome.WARNED if fetched.warnings else StepOutcome.PASSED,
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
            self._prepare(bundle.manifest.backend)
            return self._checks(bundle)
        finally:
            self.host_future = None
            if pool is not None:  # a refusal before the environment step: not taken
                pool.shutdown(wait=True, cancel_futures=True)

    def _backend(self, name: str) -> Backend | None:
        """The backend called ``name``: one instance for the whole verification, None when
        it is not known here."""
        if not self.backend_resolved:
            from dossier.backends import get_backend

            try:
                self.backend = get_backend(name)
            except SelectionError:  # unknown here: the environment step says so
                self.backend = None
            self.backend_resolved = True
        return self.backend

    def _prepare(self, name: str) -> None:
        """``prepare_backend`` with the bundle's backend, when there is a hook and the backend
        is known and imports."""
        hook = self.opts.prepare_backend
        if hook is None:
            return
        try:
            backend = self._backend(name)
        except Exception as exc:  # a plug-in that fails to import: raised at the environment
            logger.debug("backend %r not resolved ahead of the checks: %s", name, exc)
            return  # step, after the checks, as without a hook
        if backend is not None and not backend.for_tests:  # never served: said at the
            hook(backend)  # environment step

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
        # one read of every file; the records a later step reads (the environment step:
        # fingerprint.json) kept from it when the folder is read in place
        scan = scan_bundle(bundle, self._digests(), keep=_PINNED)
        bundle.pin({rel: f.data for rel, f in scan.files.items() if f.data is not None
                    and rel in bundle.manifest.table()})
        self.signed = self._signature(bundle, scan)
        self.signature_checked = True
        if self.signed is not None:
            self._step(StepName.SIGNATURE, StepOutcome.PASSED,
                       f"signature {self.signed.path}: {self.signed}")
        elif self.ignored:
            self._step(StepName.SIGNATURE, StepOutcome.WARNED,
                       f"no signature referrer passed ({len(self.ignored)} ignored) and none "
                       "was required", problems=[f"ignored: {w}" for w in self.ignored])
        else:
            self._skip(StepName.SIGNATURE, "the bundle is not signed and no signature was "
                       "required")
        self.current = StepName.INTEGRITY
        report = _bundles.check_integrity(bundle, scan)
        if not report:
            problems = [str(p) for p in report.problems] or [str(report)]
            self._step(StepName.INTEGRITY, StepOutcome.FAILED,
                       f"{self.path}: integrity check failed ({len(report.problems)} problem(s))",
                       problems=problems)
            raise IntegrityError(f"{self.path}: {report}")
        self.integrity = str(report)
        self._step(StepName.INTEGRITY, StepOutcome.PASSED,
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
        return self._environment(bundle)

    def _signature_involved(self) -> bool:
        """Whether a signature is checked: one is required, one is named, one lies beside
        the bundle, or the registry listed signature referrers."""
        o = self.opts
        return (o.require_signature or o.signature is not None
                or os.path.lexists(signature_path(self.path))
                or (self.fetched is not None and bool(self.fetched.signatures)))

    def _digests(self) -> list[str]:
        """What the signature check needs besides xxh3-128: its digests when a signature is
        involved."""
        return list(_SIGNATURE_DIGESTS) if self._signature_involved() else []

    def _signature(self, bundle: Bundle, scan: BundleScan) -> SignatureCheck | None:
        o = self.opts
        if self.fetched is not None and o.signature is None:
            from dossier.registry import check_referrer_signatures

            return check_referrer_signatures(bundle, self.fetched.signatures, o.trusted_keys,
                                             require=o.require_signature,
                                             source=self.fetched.reference, scan=scan,
                                             ignored=self.ignored)
        if self._signature_involved() or o.trusted_keys:  # keys given: loaded and validated
            from dossier.trust.signing import check_signature

            return check_signature(bundle, o.trusted_keys, require=o.require_signature,
                                   signature=o.signature, scan=scan)
        return None  # no signature and no key to check one with: dossier.trust.signing not imported

    def _environment(self, bundle: Bundle) -> VerifyReport:
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
        backend = self._backend(m.backend)
        loads = o.recheck or o.rebench or o.extract  # an engine of it is loaded after this
        refused = served_findings(m, backend, here.cpu.cores, routes=loads or (
            backend is not None and not backend.route_check_imports))
        if refused and refused[0].field == "backend":
            backend = None
        policy = backend.default_policy() if backend is not None else _common_policy()
        if o.policy is not None:
            policy = load_policy(o.policy, policy)
        if o.check_records:
            from dossier.verify.data_sets import dataset_findings

            records = dataset_findings(bundle)
        else:
            records = []
        findings = [*refused, *records,
                    *(backend.requirement_findings(here) if backend is not None else []),
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
        checked = held = None
        self.current = StepName.RECHECK
        if refused and (o.recheck or o.rebench):
            why = f"not run: {refused[0].field} refused ({refused[0].reason})"
            for name in (StepName.RECHECK, StepName.REBENCH):
                self._skip(name, why)
            return self._report(findings=findings, verdict=Verdict.INVALID, reasons=reasons,
                                exit_code=int(Verdict.INVALID.exit_code))
        if o.recheck:
            checked = recheck(bundle, threshold=o.threshold, max_s=o.recheck_max_s)
            if has_holdout(bundle):
                held = recheck(bundle, threshold=o.threshold, data_set="holdout",
                               max_s=o.recheck_max_s)
            runs = [c for c in (checked, held) if c is not None]
            passed = all(c.passed for c in runs)
            verdicts.append(Verdict.VALID if passed else Verdict.INVALID)
            for c in runs:
                if not c.passed:
                    reasons.insert(0, f"accuracy re-check failed on the {c.data_set} set: "
                                      f"{c.failure}")
            self._step(StepName.RECHECK, StepOutcome.PASSED if passed else StepOutcome.FAILED,
                       "; ".join(
                           f"{c.data_set}: worst {c.metric} loss "
                           f"{'-' if c.worst_loss is None else f'{c.worst_loss:.3g}'} "
                           f"(threshold {c.threshold:.3g})"
                           + (f": {c.failure}" if c.failure else "") for c in runs),
                       verdict=verdicts[-1])
        else:
            self._skip(StepName.RECHECK, "not asked for")
        timed = None
        self.current = StepName.REBENCH
        if o.rebench:
            timed = rebench(bundle, o.timing, max_s=o.rebench_max_s,
                            scenario=o.rebench_scenario)
            verdicts.append(Verdict.SUBOPTIMAL if timed.regression else Verdict.VALID)
            if timed.regression:
                reasons.append(timed.reason)
            self._step(StepName.REBENCH, StepOutcome.WARNED if timed.regression else StepOutcome.PASSED,
                       timed.reason, verdict=verdicts[-1])
        else:
            self._skip(StepName.REBENCH, "not asked for")
        verdict = worst(verdicts) if verdicts else Verdict.VALID
        return self._report(findings=findings, recheck=checked, recheck_holdout=held,
                            rebench=timed, verdict=verdict,
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
            from dossier.trust.signing import check_signature_at

            try:
                check_signature_at(self.path, self.opts.trusted_keys, require=True,
                                   signature=self.opts.signature)
            except DossierError as signature_error:
                exc = signature_error
        if not self.steps or self.steps[-1].outcome is not StepOutcome.FAILED:
            name = self.current
            if name is StepName.SIGNATURE and not isinstance(exc, SignatureError):
                name = StepName.INTEGRITY  # the bundle could not be opened or read
            self._step(name, StepOutcome.FAILED, exc.diagnostics())
        failed = self.steps[-1].name
        done = {s.name for s in self.steps}
        for name in StepName:
            if name not in done:
                self._skip(name, f"not run: the {failed.value} step failed")
        order = list(StepName)
        self.steps.sort(key=lambda s: order.index(s.name))
        return with_report(exc, self._report(exit_code=int(exc.exit_code),
                                             error=exc.diagnostics()))


def served_findings(m: Manifest, backend: Backend | None, cores: int | None = None, *,
                    routes: bool = True) -> list[Finding]:
    """What refuses to serve a bundle here before anything of it is loaded, as INVALID
    findings: a backend that is not a shipped one (``backend``, the instance resolved for
    the name, None when it is unknown here; or a test-only one), or a route of the shipped or
    the baseline engine that this host's knob database does not take (an unknown knob or
    value, a thread count beyond the bound of the judged host, of ``cores`` logical CPUs:
    :meth:`~dossier.backends.Backend.check_recorded_route`; the routes only with ``routes``:
    a verification that loads nothing leaves them to the load when checking them imports the
    compiler). Empty when it may be served; a backend whose library is not installed here is
    left to its requirement findings."""
    from dossier.backends import not_served

    why = not_served(m.backend, backend)
    if why is not None or backend is None:
        return [Finding(field="backend", bundle_value=m.backend, host_value="not served",
                        verdict=Verdict.INVALID, reason=str(why))]
    found: list[Finding] = []
    for role, entry in (("shipped", m.engines.shipped), ("baseline", m.engines.baseline)):
        if entry is None or not routes:
            continue
        try:
            backend.check_recorded_route(entry.route, cores)
        except BackendUnavailableError:
            return []
        except SelectionError as exc:
            found.append(Finding(field=f"engines.{role}.route", bundle_value=entry.route,
                                 host_value="refused", verdict=Verdict.INVALID,
                                 reason=exc.diagnostics()))
    return found


def _common_policy() -> Policy:
    """The rules every backend shares, for a bundle whose backend is not served here."""
    from dossier.host.policy import common_rules, tail_rules

    return Policy(rules=(*common_rules(), *tail_rules()))


_PINNED = (FINGERPRINT_NAME,)
"""Files of a folder checked in place that a later step reads: from the checked bytes."""

_OUTCOME = {Verdict.VALID: StepOutcome.PASSED, Verdict.SUBOPTIMAL: StepOutcome.WARNED,
            Verdict.INVALID: StepOutcome.FAILED}
