"""The tuner: strategy x backend x validation x timing, one child process per trial.

The tuner never prints; it reports progress to a :class:`TuneObserver`. Everything it learns is
appended to the tuning cache as it happens, so ``tune --continue`` picks up where a killed
search stopped: finished trials are never re-run, the best so far is never lost.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import itertools
import logging
import platform
import shutil
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from dossier.backends import Backend, ModelSignature, get_backend
from dossier.build_cache import BuildCache, open_build_cache
from dossier.build_plan import BuildPlan
from dossier.cache import (
    CacheHeader,
    DecisionRecord,
    FileIdentity,
    HoldoutRecord,
    SessionRecord,
    TuningCache,
    lost_session,
)
from dossier.cache_check import check_cache
from dossier.datasets import CalibrationSet, check_sets, identity, load_calibration_set
from dossier.decision import candidates, decide
from dossier.diskfull import disk_full_error, is_disk_full
from dossier.errors import (
    CacheMismatchError,
    InputError,
    OutputError,
    SelectionError,
    SpecError,
    TuneError,
)
from dossier.executors import Scheduler, open_scheduler
from dossier.executors.local import LocalScheduler
from dossier.files import replace_small
from dossier.fingerprint import Fingerprint, collect
from dossier.hashing import digest_file
from dossier.jobs.child import clear_work
from dossier.jobs.cotenants import cotenants
from dossier.jobs.placement import placed
from dossier.jobs.requests import JobRequests
from dossier.jobs.worker import FailedResult, JudgedResult, WorkerResult
from dossier.knobs import KnobDatabase
from dossier.lock import RUN_LOCK, new_or_locked_run_folder
from dossier.measure import conditions, confirmation
from dossier.measure.conditions import Conditions
from dossier.measure.target import busier, estimator_for, held_conditional, problems_here
from dossier.measure.timing import compare, summarize, unflatten
from dossier.routes import Route, Selection
from dossier.run_folder import CACHE_NAME, ENGINES, FINGERPRINT_NAME, KNOBS_NAME, WORK
from dossier.spec import ReleaseSpec
from dossier.strategies import Strategy, get_strategy
from dossier.strategies.budget import STUDY_NAME
from dossier.threshold import check_threshold
from dossier.trial import Outcome, TrialRecord
from dossier.validation import ValidationSet, load_validation_set
from dossier.version import __version__

logger = logging.getLogger(__name__)

COTENANT_MAX_S = 24 * 3600.0
"""The longest a shared target's co-tenant load runs (:mod:`dossier.jobs.cotenants`; it also
dies with the search)."""


class TuneObserver:
    """Receives progress; the CLI renders it. Every method is optional."""

    def started(self, planned: int, done: int) -> None:
        """The search starts: ``planned`` trials (an upper bound for mixed), ``done`` restored."""

    def trial_started(self, index: int, route: str, role: str) -> None:
        """A trial's child process starts."""

    def inferences_per_sample(self, n: int) -> None:
        """A timed sample runs ``n`` inferences (before ``started``; ``[timing] inputs``)."""

    def trial_finished(self, record: TrialRecord) -> None:
        """A trial's record was written to the cache."""

    def trial_log(self, index: int, path: Path) -> None:
        """Trial ``index``'s worker log: what its process printed (kept when it fails)."""

    def confirming(self, routes: list[str]) -> None:
        """The best candidates are being re-timed against the baseline."""

    def holdout(self, route: str) -> None:
        """``route`` is being checked on the hold-out set."""

    def measured_process(self, n: int, cap: int, open_routes: list[str]) -> None:
        """The confirmation's ``n``-th measuring process finished (at most ``cap``);
        ``open_routes``: the candidates still undecided."""


@dataclass
class Prepared:
    """Everything a search needs, checked."""

    spec: ReleaseSpec
    backend: Backend
    db: KnobDatabase
    selection: Selection
    strategy: Strategy
    model: Path
    vset: ValidationSet
    baseline: Route
    calibration: CalibrationSet | None = None
    holdout: ValidationSet | None = None


@dataclass
class TuneResult:
    """A finished search."""

    run_dir: Path
    cache: TuningCache
    decision: DecisionRecord
    trials_run: int = 0
    notes: list[str] = field(default_factory=list)


def _now() -> str:
    return dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")


def prepare(spec: ReleaseSpec) -> Prepared:
    """Resolve and check a spec: backend, knobs, selection, model, validation set.

    Raises the matching InputError subclass for anything that does not fit, before any file
    is written.
    """
    problems = spec.timing.problems()
    if problems:
        raise SpecError(f"[timing] cannot ship a gain: {'; '.join(problems)}",
                        hint="the signed-rank test over n rounds cannot give p below 2/2**n: "
                             "raise the rounds")
    unfit = problems_here(spec.target)
    if unfit:
        raise SpecError(f"[target] cannot be honoured on this host: {'; '.join(unfit)}",
                        hint="declare what this host can measure, or release on a host that "
                             "has it")
    backend = get_backend(spec.tune.backend)
    backend.require()
    if spec.scenario.loadgen:  # LoadGen runs the scenario: missing, refused before the search
        from dossier.scenarios.driver import loadgen
        loadgen()
    backend.configure(spec.builder, spec.shapes)
    model = spec.model_path()
    backend.check_model(model)  # a model of another kind is said at once, before the knobs
    strategy = get_strategy(spec.tune.strategy, spec)
    db = backend.knob_database()
    _check_offered(spec.tune.selection, db, backend)
    selection = Selection.parse(spec.tune.selection, db)
    signature = backend.signature(model)
    vset = load_validation_set(spec.resolve(spec.validation.path))
    for pair in vset.pairs:
        signature.check_pair(pair.name, pair.inputs, pair.references)
    for i, entry in enumerate(spec.shapes, start=1):
        signature.check_shape_entry(f"[[shapes]] entry {i}", entry.inputs)
    check_threshold(spec.tune.metric, spec.tune.threshold, vset, atol=spec.tune.atol,
                    rtol=spec.tune.rtol)
    calibration, holdout = _data_sets(spec, signature, vset)
    needs = [r for r in _selection_corners(selection, db) if backend.needs_calibration(r, db)]
    if needs and calibration is None:
        raise SpecError(f"the selection has routes that need a calibration set ({needs[0]}), "
                        "and the spec names none",
                        hint="add [calibration] path = ... (inputs only, never validation or "
                             "hold-out samples; `dossier validation split` makes one)")
    baseline = selection.baseline(db)
    spec = _with_timing_defaults(spec, backend.timing_defaults(baseline, db))
    probe = dict(baseline.as_dict())
    for item in selection.items:
        for value in item.values:
            if value == "off":
                probe[item.knob] = "off"
    backend.check_route(model, Route.of(probe), db)
    return Prepared(spec, backend, db, selection, strategy, model, vset, baseline, calibration,
                    holdout)


def _check_offered(text: str, db: KnobDatabase, backend: Backend) -> None:
    """SelectionError with the reason for a knob the backend has but does not offer on this
    host (an execution provider that is not installed, say): not a mere unknown knob."""
    missing = backend.knobs_not_offered()
    for token in text.split():
        name = token.lstrip("-").partition("=")[0]
        if name in missing and name not in db.names():
            raise SelectionError(f"not offered on this host: {missing[name]}",
                                 hint=f"`dossier knobs --backend {db.backend}` lists what is")


def _data_sets(spec: ReleaseSpec, signature: ModelSignature, vset: ValidationSet
               ) -> tuple[CalibrationSet | None, ValidationSet | None]:
    """The calibration and hold-out sets a spec names, read and checked against the model and
    against each other and the validation set, every input finite
    (:func:`dossier.datasets.check_sets`)."""
    calibration = holdout = None
    if spec.calibration is not None:
        calibration = load_calibration_set(spec.resolve(spec.calibration.path))
        for name, inputs in calibration.samples:
            signature.check_inputs(f"calibration sample {name}", inputs)
    if spec.holdout is not None:
        holdout = load_validation_set(spec.resolve(spec.holdout.path), "hold-out set")
        for pair in holdout.pairs:
            signature.check_pair(f"hold-out {pair.name}", pair.inputs, pair.references)
    check_sets(vset, calibration, holdout, {t.name: t.dtype for t in signature.inputs})
    return calibration, holdout


def _selection_corners(selection: Selection, db: KnobDatabase) -> list[Route]:
    """The baseline with each varied knob at each of its listed values: enough to see whether
    any route of the selection needs data to build (one knob decides it)."""
    base = selection.baseline(db).as_dict()
    return [Route.of({**base, item.knob: v}) for item in selection.items for v in item.values]


def _with_timing_defaults(spec: ReleaseSpec, defaults: dict[str, object]) -> ReleaseSpec:
    """``spec`` with the backend's timing defaults for its engines (:meth:`Backend.
    timing_defaults`) where ``[timing]`` leaves them unset."""
    unset = {k: v for k, v in defaults.items() if k not in spec.timing.model_fields_set}
    if not unset:
        return spec
    return spec.model_copy(update={"timing": spec.timing.model_copy(update=unset)})


def plan(spec: ReleaseSpec) -> tuple[Route, list[Route]]:
    """The baseline and the ordered routes of a strategy that plans ahead (``--dry-run``)."""
    p = prepare(spec)
    if not p.strategy.plans_ahead:
        raise InputError(f"--dry-run cannot list the routes of strategy {p.strategy.name!r}: its "
                        "second phase depends on measured results",
                        hint="dry-run the fast phase with --strategy fast")
    return p.baseline, p.strategy.plan(p.selection, p.db)


def _header(p: Prepared, spec_path: Path | None, warm_start: list[Route],
            parent: str | None) -> CacheHeader:
    digest, size = digest_file(p.model)
    host = {"hostname": platform.node(), "machine": platform.machine(),
            "python": platform.python_version(), **p.backend.stack()}
    spec = p.spec.resolved(model=p.model, validation=p.vset.path.resolve(),
                           selection=p.selection.text())
    return CacheHeader(
        tool_version=__version__, created_at=_now(), spec=spec,
        tuner_version=p.db.tuner_version, knob_db_digest=p.db.digest(),
        model=FileIdentity(path=str(p.model), size=size, digest=digest),
        validation_digest=p.vset.digest(), validation_pairs=len(p.vset.pairs),
        inferences_per_sample=len(p.vset.timing_groups(p.spec.timing.inputs)),
        baseline_route=p.baseline.text(),
        calibration=identity("calibration", p.calibration) if p.calibration else None,
        holdout=identity("holdout", p.holdout) if p.holdout else None,
        spec_path=str(spec_path.resolve()) if spec_path else None, host=host,
        warm_start=[r.text() for r in warm_start], parent=parent)


_IDENTITY_BY_DIGEST = {"model": {"path"}, "validation": {"path"}, "calibration": {"path"},
                       "holdout": {"path"}}
"""Spec fields a resume does not compare: the model and the validation set are compared by
their digests (a moved file with the same bytes is the same input)."""


def _check_resume(cache: TuningCache, fresh: CacheHeader) -> None:
    old = cache.header
    checks: list[tuple[str, object, object]] = [
        ("model", old.model.digest, fresh.model.digest),
        ("validation set", old.validation_digest, fresh.validation_digest),
        ("knob database", old.knob_db_digest, fresh.knob_db_digest),
        ("calibration set", old.calibration.digest if old.calibration else None,
         fresh.calibration.digest if fresh.calibration else None),
        ("hold-out set", old.holdout.digest if old.holdout else None,
         fresh.holdout.digest if fresh.holdout else None),
        ("warm start", old.warm_start, fresh.warm_start)]
    checks += _differences(old.spec.model_dump(mode="json", exclude=_IDENTITY_BY_DIGEST),
                           fresh.spec.model_dump(mode="json", exclude=_IDENTITY_BY_DIGEST))
    for what, was, now in checks:
        if was != now:
            raise CacheMismatchError(
                f"cannot continue {cache.path}: the {what} changed since the search started "
                f"({_short(was)} -> {_short(now)})")


def _differences(old: object, new: object, where: str = "spec") -> list[tuple[str, object, object]]:
    """Where two dumps of a spec differ: ``(dotted path, old, new)`` for each differing leaf,
    tables descended into (``spec.tune.threshold``), lists compared whole."""
    if isinstance(old, dict) and isinstance(new, dict):
        return [d for key in sorted(old.keys() | new.keys())
                for d in _differences(old.get(key), new.get(key), f"{where}.{key}")]
    return [] if old == new else [(where, old, new)]


def _short(v: object) -> str:
    s = str(v)
    return s if len(s) <= 40 else s[:37] + "..."


class Tuner:
    """One search over one run folder."""

    def __init__(self, p: Prepared, run_dir: Path, cache: TuningCache,
                 observer: TuneObserver | None = None, warm_start: list[Route] | None = None,
                 build_jobs: int | None = None, executor: Scheduler | None = None,
                 build_cache: BuildCache | None = None,
                 host: Fingerprint | None = None) -> None:
        """``executor``: where build and measure jobs run (None: here, by a
        :class:`~dossier.executors.local.LocalScheduler` with ``build_jobs`` concurrent
        builds and the ``build_cache``; see :mod:`dossier.executors`). ``host``: this host's
        fingerprint when the caller has collected it (the build cache's key needs it; None:
        collected when needed)."""
        self.p, self.run_dir, self.cache = p, run_dir, cache
        self.warm_start = list(warm_start or [])
        self.observer = observer or TuneObserver()
        self.work = run_dir / WORK
        self.engines = run_dir / ENGINES
        self.work.mkdir(exist_ok=True)
        self.engines.mkdir(exist_ok=True)
        self.ran = 0
        self.plan = BuildPlan(p.backend, p.db, model_digest=cache.header.model.digest,
                              builder=p.spec.builder, shapes=p.spec.shapes, host=host,
                              calibration=p.calibration.digest() if p.calibration else None)
        self.requests = JobRequests(p.spec, p.backend.name, p.model, p.vset.path, p.baseline,
                                    p.db, self.plan, cache, run_dir, self.engines, self.work,
                                    p.calibration.path.resolve() if p.calibration else None)
        self.scheduler: Scheduler = executor if executor is not None else \
            LocalScheduler(p.backend, build_jobs, build_cache)
        self.scheduler.attach(self.requests)
        self._canonical: dict[str, str] = {}
        p.strategy.open(run_dir)  # where a strategy keeps its state for --continue

    def run_trial(self, route: Route, role: str) -> TrialRecord:
        """Build (or take the build job's engine, or an earlier trial's), then measure one
        route in a child process, and append its record."""
        index = len(self.cache.trials)
        job = self.requests.trial(route, index, role)
        started: list[str] = []

        def start() -> None:
            self.observer.trial_started(index, route.text(), role)
            log = self.work / f"trial-{index:04d}.log"
            logger.info("trial %d (%s) %s started; its log: %s", index, role, route, log)
            self.observer.trial_log(index, log)
            started.append(_now())

        t = self.p.spec.timing
        # what this host does meanwhile (dossier.measure.conditions), where the trial runs here
        watch = conditions.start(t.quiet_host, t.quiet_share, t.quiet_wait_s) \
            if self.scheduler.measures_here else None
        result, trial_s = self.scheduler.trial(route, index, job, start)
        return self._append(index, route, role, result, Path(job.req.engine or ""), trial_s,
                            started[0] if started else _now(), watch.stop() if watch else None)

    def _append(self, index: int, route: Route, role: str, result: WorkerResult, engine: Path,
                trial_s: float, started: str, seen: Conditions | None = None) -> TrialRecord:
        record = self._record(index, route, role, result, engine, trial_s, started, seen)
        if seen is not None:  # what the host was doing meanwhile (dossier.measure.conditions)
            record = record.model_copy(update={"conditions": [seen]})
        if record.outcome is not Outcome.OK:
            engine.unlink(missing_ok=True)
        self.cache.append(record)
        logger.info("trial %d ended %s in %.2f s%s", index, record.outcome.value, trial_s,
                    f" ({record.reason})" if record.reason else "")
        self.ran += 1
        self.observer.trial_finished(record)
        return record

    def _record(self, index: int, route: Route, role: str, result: WorkerResult,
                engine: Path, trial_s: float, started: str,
                seen: Conditions | None = None) -> TrialRecord:
        common = dict(index=index, route=route.text(), role=role, trial_s=trial_s,
                      started_at=started, phases_s=result.phases_s)
        if isinstance(result, FailedResult):
            extra = {k: str(v) for k, v in result.facts.items()}
            if result.log_tail:  # keep what the dying process said last
                extra["log_tail"] = result.log_tail
            return TrialRecord(**common, outcome=Outcome(result.outcome), reason=result.reason,
                               build_s=result.build_s, extra=extra)
        if not isinstance(result, JudgedResult):
            raise TuneError(f"trial {index}: the worker answered {result.outcome!r} to a trial")
        outcome = Outcome(result.outcome)
        settings = self.p.spec.timing
        timing_summary = comparison = None
        if (result.samples_ms and result.baseline_samples_ms and result.sample_rounds is not None
                and result.baseline_sample_rounds is not None):
            timing_summary = summarize(result.samples_ms, settings.confidence,
                                       result.warmup_runs or 0)
            comparison = compare(unflatten(result.baseline_samples_ms,
                                           result.baseline_sample_rounds),
                                 unflatten(result.samples_ms, result.sample_rounds), settings,
                                 baseline_warmup=result.baseline_warmup_runs or 0,
                                 estimator=estimator_for([seen], settings.quiet_share))
        kept = outcome is Outcome.OK and engine.exists()
        return TrialRecord(
            **common, outcome=outcome, reason=result.reason, losses=result.losses or None,
            worst_loss=result.worst_loss, timing=timing_summary, comparison=comparison,
            samples_ms=result.samples_ms, baseline_samples_ms=result.baseline_samples_ms,
            sample_rounds=result.sample_rounds,
            baseline_sample_rounds=result.baseline_sample_rounds, raced=result.raced,
            build_s=result.build_s,
            engine=str(engine.relative_to(self.run_dir)) if kept else None,
            engine_digest=digest_file(engine)[0] if kept else None,
            extra={k: str(v) for k, v in result.facts.items()},
            load=self.p.backend.production_load(route, self.p.db) if kept else None,
            engine_flags=dict(self.p.backend.engine_facts(route, self.p.db)) if kept else None)

    def confirm(self, chosen: list[TrialRecord]) -> str:
        """Re-measure the chosen candidates in measuring processes of their own
        (:mod:`dossier.measure.confirmation`), each with the baseline and a second load of it (the A/A);
        record one confirmation trial per candidate and one for the A/A. Returns why the
        confirmation stopped."""
        self.observer.confirming([t.route for t in chosen])
        base = next(t for t in self.cache.trials if t.role == "baseline")
        timing = self.p.spec.timing
        started = _now()
        engines = [(self.run_dir / t.engine, t.route) for t in [base, *chosen]]  # type: ignore[operator]
        env = {k: v for e, _ in engines for k, v in self.p.backend.loader_env(e).items()}
        measure = self.scheduler.measure_process(timing, env)
        # a confirmed route outranks the others only once it passed the hold-out set (checked
        # then, recorded once): one that fails it leaves the next its chance to be confirmed
        may_ship = ((lambda route: self._holdout(route).passed)
                    if self.p.holdout is not None else None)
        result = confirmation.confirm(engines[0], engines[1:], timing, measure,
                                      on_process=self.observer.measured_process,
                                      may_ship=may_ship)
        for rec in confirmation.records(result, base, chosen, timing, len(self.cache.trials),
                                        started):
            self.cache.append(rec)
            self.observer.trial_finished(rec)
        return result.stopped

    def _queue_builds(self, results: dict[str, TrialRecord]) -> None:
        """Queue the builds of every route known to come (all of them for strategies that plan
        ahead; for mixed, phase 2's once phase 1 is measured), but those of routes that reuse
        an earlier trial's engine."""
        s = self.p
        index, seen = len(self.cache.trials), set(results)
        for route in itertools.chain([s.baseline], self.warm_start,
                                     s.strategy.ahead(s.selection, s.db, results)):
            if route.text() in seen or self.twin(route, seen):
                continue
            seen.add(route.text())
            if self.plan.reuse(route, self.cache.trials, self.run_dir) is None:
                self.scheduler.want(route, index)
            index += 1  # measured in this order, one trial index each

    def canonical(self, route: Route) -> str:
        """``route`` with the knobs that have no effect under it (:meth:`Backend.inert_knobs`)
        at their defaults: routes with the same canonical text build and run the same engine."""
        db = self.p.db
        inert = self.p.backend.inert_knobs(route, db)
        if not inert:
            return route.text()
        return Route.of({k: db.get(k).default if k in inert else v
                         for k, v in route.as_dict().items()}).text()

    def twin(self, route: Route, done: Iterable[str]) -> str | None:
        """A route of ``done`` (route texts) that builds and runs the same engine as ``route``
        (they differ only in knobs without effect): ``route`` is not measured again."""
        mine, text = self.canonical(route), route.text()
        for t in done:
            if t != text:
                other = self._canonical.get(t)
                if other is None:
                    other = self._canonical[t] = self.canonical(Route.parse(t))
                if other == mine:
                    return t
        return None

    def _measure_all(self, results: dict[str, TrialRecord]) -> None:
        s = self.p
        self._queue_builds(results)
        base = next((t for t in self.cache.trials if t.role == "baseline"), None)
        if base is None:
            base = self.run_trial(s.baseline, "baseline")
            results[base.route] = base
        if base.outcome is not Outcome.OK:
            raise TuneError(f"the baseline route {s.baseline} did not pass: {base.outcome.value}: "
                            f"{base.reason}", hint="dossier needs a working baseline to compare "
                            "against; fix the model, the validation set or the threshold")
        for route in itertools.chain(self.warm_start,
                                     s.strategy.routes(s.selection, s.db, results)):
            if route.text() in results:
                continue
            twin = self.twin(route, results)
            if twin is not None:  # the same engine, measured already: what the strategy sees
                results[route.text()] = results[twin]
                continue
            results[route.text()] = self.run_trial(route, "search")
            self._queue_builds(results)

    def search(self) -> DecisionRecord:
        """Run (or finish) the search and decide."""
        results = {t.route: t for t in self.cache.trials if t.role != "confirm"}
        s = self.p
        planned = s.strategy.count(s.selection, s.db) + len(self.warm_start)
        if s.baseline.text() not in {r.text() for r in s.strategy.plan(s.selection, s.db)} \
                if s.strategy.plans_ahead else False:
            planned += 1
        self.observer.inferences_per_sample(self.cache.header.per_sample)
        self.observer.started(planned, len(results))
        try:
            self._measure_all(results)
        finally:
            self.scheduler.drop_pending()
        if self.cache.decision is not None:
            return self.cache.decision
        confirmed = {t.route for t in self.cache.trials if t.role == "confirm"}
        top = candidates(self.cache.trials, s.spec.timing)[: s.spec.timing.confirm_top]
        stopped = None
        if top and s.spec.timing.confirm_top > 0 and not {t.route for t in top} <= confirmed:
            stopped = self.confirm(top)  # not yet, or cut short by a kill: run it whole
        held = held_conditional(self.cache.trials, s.spec.target, s.backend.contention_knobs,
                                s.spec.timing.quiet_share)
        decision = decide(self.cache.trials, s.spec.timing, stopped=stopped, excluded=held)
        if s.holdout is not None:
            decision = self._gate(decision, stopped, held)
        decision = self._conditions(decision, held)
        self.cache.append(decision)
        return decision

    def _conditions(self, decision: DecisionRecord, held: dict[str, str]) -> DecisionRecord:
        """The decision with what it says of the target conditions: the estimator of the
        reading that decided, how many of its measurements were busier than declared, the
        routes held as conditional, and whether the shipped one is conditional."""
        share = self.p.spec.timing.quiet_share
        route = decision.shipped_route if decision.gain else None
        rests = [t for t in self.cache.trials if t.role == "confirm" and t.comparison
                 and (route is None or t.route in (route, decision.baseline_route))] or \
            [t for t in self.cache.trials if t.route == (route or decision.baseline_route)]
        seen = [c for t in rests[-1:] for c in (t.conditions or [])]
        shipped = next((t.comparison for t in reversed(self.cache.trials)
                        if route is not None and t.route == route and t.comparison), None)
        again = held_conditional(self.cache.trials, self.p.spec.target,
                                 self.p.backend.contention_knobs, share, hold=False)
        return decision.model_copy(update={
            "estimator": (shipped.estimator if shipped is not None
                          else estimator_for(seen, share)),
            "busier_than_declared": sum(busier(c, share) for c in seen) if seen else None,
            "conditional_held": [r for r in held if r != route],
            "conditional": route is not None and route in again})

    def _gate(self, decision: DecisionRecord, stopped: str | None,
              held: dict[str, str]) -> DecisionRecord:
        """The hold-out gate: the route about to ship is checked on the hold-out set; one that
        fails it does not ship, and the rule is applied again without it (the next confirmed
        route, or the baseline). The baseline is checked beside it, so a reader can tell a
        route that broke from references or a threshold the baseline misses too."""
        timing = self.p.spec.timing
        # the two first checks at once: nothing is timed now, and each is a process of its own
        base = self._holdouts([decision.baseline_route,
                               *([decision.shipped_route] if decision.gain else [])])[0]
        failed: dict[str, str] = {}
        while decision.gain:
            check = self._holdout(decision.shipped_route)
            if check.passed:
                break
            failed[decision.shipped_route] = f"failed the hold-out set ({check.reason or 'failed'})"
            decision = decide(self.cache.trials, timing, stopped=stopped,
                              excluded={**held, **failed})
        notes = []
        if failed and decision.gain:
            notes.append(f"{', '.join(failed)} {next(iter(failed.values()))} and did not ship")
        if not base.passed:
            notes.append(f"the baseline fails the hold-out set too ({base.reason}): look at its "
                         "references and at the threshold")
        shipped = base if not decision.gain else self._holdout(decision.shipped_route)
        return decision.model_copy(update={
            "holdout": shipped, "holdout_rejected": list(failed),
            "reason": "; ".join([decision.reason, *notes])})

    def _holdout(self, route: str) -> HoldoutRecord:
        """``route``'s check on the hold-out set (:meth:`_holdouts`)."""
        return self._holdouts([route])[0]

    def _holdouts(self, routes: list[str]) -> list[HoldoutRecord]:
        """Each route's check on the hold-out set, each a check job of the scheduler (in a
        process of its own, the processes running at once); recorded once, in the order of
        ``routes`` (a resumed search takes the recorded ones)."""
        holdout = self.p.holdout
        assert holdout is not None
        done = {h.route: h for h in self.cache.holdouts if h.route in routes}
        todo = [(route, next(t for t in self.cache.trials
                             if t.route == route and t.role != "confirm" and t.engine))
                for route in dict.fromkeys(r for r in routes if r not in done)]
        jobs = []
        for route, trial in todo:
            self.observer.holdout(route)
            jobs.append(self.requests.check(route, trial.index, self.run_dir / str(trial.engine),
                                            holdout.path.resolve()))
        if jobs:
            with contextlib.closing(self.scheduler.check(jobs)) as results:
                for (route, trial), result in zip(todo, results, strict=True):
                    done[route] = self._holdout_record(route, trial, result, holdout)
        return [done[r] for r in routes]

    def _holdout_record(self, route: str, trial: TrialRecord, result: WorkerResult,
                        holdout: ValidationSet) -> HoldoutRecord:
        if isinstance(result, JudgedResult):
            record = HoldoutRecord(route=route, trial_index=trial.index,
                                   passed=result.outcome == "ok", reason=result.reason,
                                   losses=result.losses or None, worst_loss=result.worst_loss,
                                   pairs=len(holdout.pairs))
        else:
            why = getattr(result, "reason", None) or f"the engine ended {result.outcome}"
            record = HoldoutRecord(route=route, trial_index=trial.index, passed=False,
                                   reason=why, pairs=len(holdout.pairs))
        self.cache.append(record)
        logger.info("hold-out check of %s: %s", route,
                    "passed" if record.passed else f"failed ({record.reason})")
        return record


def tune(spec: ReleaseSpec, out: Path, *, observer: TuneObserver | None = None,
         spec_path: Path | None = None, resume: bool = False,
         warm_start: list[str] | None = None, parent: str | None = None,
         build_jobs: int | None = None, executor: str = "local",
         address: str | None = None, build_cache: str | Path | None = None) -> TuneResult:
    """Search ``spec``'s selection and decide, writing everything under ``out``.

    ``out`` must not hold a search yet unless ``resume``; with ``resume`` the cache there is
    checked against the spec's inputs (model, validation set, knob database, selection...) and
    every record against the header and the knob database (:mod:`dossier.cache_check`), and
    the search continues. ``warm_start`` routes are measured first, right after the baseline
    (routes the selection does not allow are refused); ``parent`` is recorded in the header.
    ``build_jobs`` builds run at once (None: from the cores; see :mod:`dossier.jobs.builds`); the
    results do not depend on it, only the wall time does. ``executor`` ``"ray"`` runs build and
    measure jobs on the Ray cluster at ``address`` (see :mod:`dossier.executors`).
    ``build_cache``: a folder of engines kept across searches (:mod:`dossier.build_cache`;
    None: the folder ``DOSSIER_BUILD_CACHE`` names, if set); local builds only.
    The run folder is locked for the whole search (BusyError when another process holds it);
    a full disk stops it with DiskFullError, recording nothing false.
    """
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise OutputError(f"--out {out} is a file, not a folder",
                          hint="give a folder for the run (it is created when missing)")
    with new_or_locked_run_folder(out):
        return _tune(spec, out, observer=observer, spec_path=spec_path, resume=resume,
                     warm_start=warm_start, parent=parent, build_jobs=build_jobs,
                     executor=executor, address=address, build_cache=build_cache)


def _tune(spec: ReleaseSpec, out: Path, *, observer: TuneObserver | None = None,
          spec_path: Path | None = None, resume: bool = False,
          warm_start: list[str] | None = None, parent: str | None = None,
          build_jobs: int | None = None, executor: str = "local",
          address: str | None = None, build_cache: str | Path | None = None) -> TuneResult:
    """The search itself, under the run folder's lock (see :func:`tune`)."""
    p = prepare(spec)
    if build_jobs is not None and build_jobs < 1:
        raise InputError(f"--build-jobs must be at least 1 (got {build_jobs})")
    store = open_build_cache(build_cache)
    if store is not None and executor != "local":
        raise InputError(f"--build-cache works with local builds only, not --executor {executor}",
                         hint="leave out --build-cache (or unset DOSSIER_BUILD_CACHE)")
    warm = [Route.parse(text, p.db) for text in (warm_start or [])]
    cache_path = out / CACHE_NAME
    fresh = _header(p, spec_path, warm, parent)
    if resume:
        cache = TuningCache.open(cache_path, repair=True)
        if not any(t.admissible for t in cache.trials):
            # a start that failed (the baseline did not pass, or was killed before it ended):
            # nothing worth keeping, so begin again with the inputs as they are now
            _clear_failed_start(out)
            resume = False
        else:
            _check_resume(cache, fresh)
            check_cache(cache, p.db, out, vset=p.vset)
            lost = lost_session(cache)
            if lost is not None:  # a run killed before it wrote its own record
                cache.append(lost)
    if not resume and out.exists() and any(e.name != RUN_LOCK for e in out.iterdir()):
        raise OutputError(f"output folder {out} is not empty",
                          hint="choose a new --out, or --continue the search that is there")
    # before any file: a cluster that refuses writes none
    ex = open_scheduler(executor, address, p.backend, p.model, p.vset.path)
    try:
        if not resume:
            out.mkdir(parents=True, exist_ok=True)
            cache = TuningCache.create(cache_path, fresh)
        # written after the header: a kill in between leaves them to --continue (the knob
        # database matches the header's digest; the fingerprint is of the host tuning now)
        if not (out / KNOBS_NAME).is_file():
            _write_json(out / KNOBS_NAME, p.db.model_dump_json(indent=2))
        here: Fingerprint | None = None  # this host's, when collected now
        if not (out / FINGERPRINT_NAME).is_file():  # of the host that measures
            if ex is None:
                here = fp = collect(include_compiler=p.backend.fingerprint_compiler)
            else:
                fp = ex.fingerprint()
            _write_json(out / FINGERPRINT_NAME, fp.model_dump_json(indent=2))
    except OSError as exc:
        _close(ex)
        if is_disk_full(exc):
            raise disk_full_error(exc, out, "writing the run folder") from exc
        raise OutputError(f"cannot write to {out}: {exc.strerror}") from exc
    started, t0 = _now(), time.perf_counter()
    target = p.spec.target
    # pinned (and, for a dedicated target, ahead of other work) before any worker starts:
    # every process of the search inherits it (dossier.jobs.placement)
    with placed(target) as where:
        tuner = Tuner(p, out, cache, observer, warm, build_jobs, ex, store, here)
        try:
            with cotenants(target.co_tenants, where.cores, COTENANT_MAX_S):
                decision = tuner.search()
        except KeyboardInterrupt:
            cache.append(SessionRecord(started_at=started, wall_s=time.perf_counter() - t0,
                                       trials_run=tuner.ran, interrupted=True))
            raise
        finally:
            _close(tuner.scheduler)  # the given executor, or the tuner's own
    cache.append(SessionRecord(started_at=started, wall_s=time.perf_counter() - t0,
                               trials_run=tuner.ran, interrupted=False))
    if p.spec.scenario.loadgen:  # the serving configurations compete under the scenario
        from dossier.scenarios.release import after_search
        decision = after_search(cache, decision, out, p.db, p.spec.scenario,
                                backend=p.backend.name, timing=p.spec.timing)
    clear_work(tuner.work, [f"trial-{t.index:04d}" for t in cache.trials if not t.admissible])
    notes = list(ex.notes) if ex is not None else []
    notes += where.notes + p.strategy.notes()
    if store is not None:
        notes += [*store.notes, f"build cache {store.folder}: {store.hits} engine(s) taken, "
                  f"{store.stored} stored"]
    return TuneResult(out, cache, decision, tuner.ran, notes)


def _close(ex: Scheduler | None) -> None:
    if ex is not None:
        ex.close()


def _clear_failed_start(out: Path) -> None:
    """Remove what a search that never got an admissible trial wrote in ``out``."""
    for name in (CACHE_NAME, KNOBS_NAME, FINGERPRINT_NAME, STUDY_NAME):
        (out / name).unlink(missing_ok=True)
    for name in (ENGINES, WORK):
        shutil.rmtree(out / name, ignore_errors=True)


def _write_json(path: Path, text: str) -> None:
    replace_small(path, (text + "\n").encode("utf-8"))  # a full disk leaves no knobs.json.tmp


def continue_tune(cache_path: Path, *, observer: TuneObserver | None = None,
                  build_jobs: int | None = None, executor: str = "local",
                  address: str | None = None, build_cache: str | Path | None = None
                  ) -> TuneResult:
    """Resume the search recorded in ``cache_path`` (its folder is the run folder)."""
    cache_path = Path(cache_path)
    if cache_path.is_dir():
        cache_path = cache_path / CACHE_NAME
    cache = TuningCache.open(cache_path)
    spec = cache.header.spec
    path = Path(cache.header.spec_path) if cache.header.spec_path else None
    return tune(spec, cache_path.parent, observer=observer, spec_path=path, resume=True,
                warm_start=cache.header.warm_start, parent=cache.header.parent,
                build_jobs=build_jobs, executor=executor, address=address,
                build_cache=build_cache)
