"""The search loop: the baseline, then the strategy's routes, each trial run by the search's
scheduler and recorded in trial order; then the confirmation, the rule, the hold-out gate and
what the decision says of the target conditions."""

from __future__ import annotations

import itertools
import logging
from collections.abc import Iterable
from pathlib import Path

from dossier.build_cache import BuildCache
from dossier.build_plan import BuildPlan
from dossier.cache import DecisionRecord, TuningCache
from dossier.decision import candidates, decide
from dossier.errors import TuneError
from dossier.executors import Scheduler
from dossier.executors.local import LocalScheduler
from dossier.fingerprint import Fingerprint
from dossier.jobs.requests import JobRequests
from dossier.jobs.worker import WorkerResult
from dossier.measure import conditions
from dossier.measure.conditions import Conditions
from dossier.measure.target import busier, estimator_for, held_conditional
from dossier.routes import Route
from dossier.run_folder import ENGINES, WORK, trial_name
from dossier.trial import Outcome, TrialRecord
from dossier.tuner.confirm import confirm
from dossier.tuner.gate import HoldoutGate
from dossier.tuner.observer import TuneObserver
from dossier.tuner.prepare import Prepared
from dossier.tuner.trials import now, trial_record

logger = logging.getLogger("dossier.tuner")  # the search's records, under one name


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
        self.gate = HoldoutGate(p.holdout, cache, run_dir, self.requests, self.scheduler,
                                self.observer, p.spec.timing) if p.holdout is not None else None
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
            log = self.work / f"{trial_name(index)}.log"
            logger.info("trial %d (%s) %s started; its log: %s", index, role, route, log)
            self.observer.trial_log(index, log)
            started.append(now())

        t = self.p.spec.timing
        # what this host does meanwhile (dossier.measure.conditions), where the trial runs here
        watch = conditions.start(t.quiet_host, t.quiet_share, t.quiet_wait_s) \
            if self.scheduler.measures_here else None
        result, trial_s = self.scheduler.trial(route, index, job, start)
        return self._append(index, route, role, result, Path(job.req.engine or ""), trial_s,
                            started[0] if started else now(), watch.stop() if watch else None)

    def _append(self, index: int, route: Route, role: str, result: WorkerResult, engine: Path,
                trial_s: float, started: str, seen: Conditions | None = None) -> TrialRecord:
        record = trial_record(self.p, self.run_dir, index, route, role, result, engine,
                              trial_s, started, seen)
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

    def confirm(self, chosen: list[TrialRecord]) -> str:
        """Re-measure the chosen candidates (:func:`dossier.tuner.confirm.confirm`); returns
        why the confirmation stopped."""
        return confirm(chosen, cache=self.cache, run_dir=self.run_dir, backend=self.p.backend,
                       scheduler=self.scheduler, timing=self.p.spec.timing,
                       observer=self.observer, gate=self.gate)

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
        if self.gate is not None:
            decision = self.gate.apply(decision, stopped, held)
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
