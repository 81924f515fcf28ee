"""A trial's record, from what its worker answered (the search appends it to the tuning
cache, in trial order)."""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import TYPE_CHECKING

from dossier.errors import TuneError
from dossier.hashing import digest_file
from dossier.jobs.worker import FailedResult, JudgedResult, WorkerResult
from dossier.measure.conditions import Conditions
from dossier.measure.target import estimator_for
from dossier.measure.timing import compare, summarize, unflatten
from dossier.routes import Route
from dossier.trial import Outcome, TrialRecord

if TYPE_CHECKING:
    from dossier.tuner.prepare import Prepared


def now() -> str:
    """The time now, as records give it (UTC, to the second)."""
    return dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")


def trial_record(p: Prepared, run_dir: Path, index: int, route: Route, role: str,
                 result: WorkerResult, engine: Path, trial_s: float, started: str,
                 seen: Conditions | None = None) -> TrialRecord:
    """Trial ``index``'s record from its worker's result: its timing summarized and compared
    with the baseline's (with ``seen``, what the host was doing meanwhile), its engine kept
    (its digest, how production loads it) when it passed."""
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
    settings = p.spec.timing
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
        engine=str(engine.relative_to(run_dir)) if kept else None,
        engine_digest=digest_file(engine)[0] if kept else None,
        extra={k: str(v) for k, v in result.facts.items()},
        load=p.backend.production_load(route, p.db) if kept else None,
        engine_flags=dict(p.backend.engine_facts(route, p.db)) if kept else None)
