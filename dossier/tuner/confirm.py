"""The confirmation of a search: its best candidates re-measured in measuring processes of
their own (:mod:`dossier.measure.confirmation`; the processes come from the search's
scheduler), each with the baseline and a second load of it (the A/A)."""

from __future__ import annotations

from pathlib import Path

from dossier.backends import Backend
from dossier.cache import TuningCache
from dossier.executors import Scheduler
from dossier.measure import confirmation
from dossier.measure.timing import TimingSettings
from dossier.trial import TrialRecord
from dossier.tuner.gate import HoldoutGate
from dossier.tuner.observer import TuneObserver
from dossier.tuner.trials import now


def confirm(chosen: list[TrialRecord], *, cache: TuningCache, run_dir: Path, backend: Backend,
            scheduler: Scheduler, timing: TimingSettings, observer: TuneObserver,
            gate: HoldoutGate | None) -> str:
    """Re-measure the ``chosen`` candidates; record one confirmation trial per candidate and
    one for the A/A in ``cache``. With a hold-out ``gate``, a confirmed route outranks the
    others only once it passed the hold-out set. Returns why the confirmation stopped."""
    observer.confirming([t.route for t in chosen])
    base = next(t for t in cache.trials if t.role == "baseline")
    started = now()
    engines = [(run_dir / t.engine, t.route) for t in [base, *chosen]]  # type: ignore[operator]
    env = {k: v for e, _ in engines for k, v in backend.loader_env(e).items()}
    measure = scheduler.measure_process(timing, env)
    # a confirmed route outranks the others only once it passed the hold-out set (checked
    # then, recorded once): one that fails it leaves the next its chance to be confirmed
    may_ship = (lambda route: gate.check(route).passed) if gate is not None else None
    result = confirmation.confirm(engines[0], engines[1:], timing, measure,
                                  on_process=observer.measured_process, may_ship=may_ship)
    for rec in confirmation.records(result, base, chosen, timing, len(cache.trials), started):
        cache.append(rec)
        observer.trial_finished(rec)
    return result.stopped
