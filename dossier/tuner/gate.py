"""The hold-out gate: the route about to ship is checked on the hold-out set, which the search
never saw; one that fails it does not ship. Each check is a check job of the search's
scheduler (:meth:`dossier.executors.Scheduler.check`), recorded once in the tuning cache."""

from __future__ import annotations

import contextlib
import logging
from pathlib import Path

from dossier.cache import DecisionRecord, HoldoutRecord, TuningCache
from dossier.decision import decide
from dossier.executors import Scheduler
from dossier.jobs.requests import JobRequests
from dossier.jobs.worker import JudgedResult, WorkerResult
from dossier.measure.timing import TimingSettings
from dossier.trial import TrialRecord
from dossier.tuner.observer import TuneObserver
from dossier.validation import ValidationSet

logger = logging.getLogger("dossier.tuner")  # the search's records, under one name


class HoldoutGate:
    """The hold-out checks of one search."""

    def __init__(self, holdout: ValidationSet, cache: TuningCache, run_dir: Path,
                 requests: JobRequests, scheduler: Scheduler, observer: TuneObserver,
                 timing: TimingSettings) -> None:
        self.holdout, self.cache, self.run_dir = holdout, cache, run_dir
        self.requests, self.scheduler, self.observer = requests, scheduler, observer
        self.timing = timing

    def apply(self, decision: DecisionRecord, stopped: str | None,
              held: dict[str, str]) -> DecisionRecord:
        """The route about to ship is checked on the hold-out set; one that fails it does not
        ship, and the rule is applied again without it (the next confirmed route, or the
        baseline). The baseline is checked beside it, so a reader can tell a route that broke
        from references or a threshold the baseline misses too."""
        # the two first checks at once: nothing is timed now, and each is a process of its own
        base = self.checks([decision.baseline_route,
                            *([decision.shipped_route] if decision.gain else [])])[0]
        failed: dict[str, str] = {}
        while decision.gain:
            check = self.check(decision.shipped_route)
            if check.passed:
                break
            failed[decision.shipped_route] = f"failed the hold-out set ({check.reason or 'failed'})"
            decision = decide(self.cache.trials, self.timing, stopped=stopped,
                              excluded={**held, **failed})
        notes = []
        if failed and decision.gain:
            notes.append(f"{', '.join(failed)} {next(iter(failed.values()))} and did not ship")
        if not base.passed:
            notes.append(f"the baseline fails the hold-out set too ({base.reason}): look at its "
                         "references and at the threshold")
        shipped = base if not decision.gain else self.check(decision.shipped_route)
        return decision.model_copy(update={
            "holdout": shipped, "holdout_rejected": list(failed),
            "reason": "; ".join([decision.reason, *notes])})

    def check(self, route: str) -> HoldoutRecord:
        """``route``'s check on the hold-out set (:meth:`checks`)."""
        return self.checks([route])[0]

    def checks(self, routes: list[str]) -> list[HoldoutRecord]:
        """Each route's check on the hold-out set, each a check job of the scheduler (in a
        process of its own, the processes running at once); recorded once, in the order of
        ``routes`` (a resumed search takes the recorded ones)."""
        holdout = self.holdout
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
                    done[route] = self._record(route, trial, result)
        return [done[r] for r in routes]

    def _record(self, route: str, trial: TrialRecord, result: WorkerResult) -> HoldoutRecord:
        pairs = len(self.holdout.pairs)
        if isinstance(result, JudgedResult):
            record = HoldoutRecord(route=route, trial_index=trial.index,
                                   passed=result.outcome == "ok", reason=result.reason,
                                   losses=result.losses or None, worst_loss=result.worst_loss,
                                   pairs=pairs)
        else:
            why = getattr(result, "reason", None) or f"the engine ended {result.outcome}"
            record = HoldoutRecord(route=route, trial_index=trial.index, passed=False,
                                   reason=why, pairs=pairs)
        self.cache.append(record)
        logger.info("hold-out check of %s: %s", route,
                    "passed" if record.passed else f"failed ({record.reason})")
        return record
