"""Re-measuring a bundle on this host: its validation (and hold-out) set run through the
shipped engine (:func:`recheck`), and the shipped engine re-timed against the baseline
(:func:`rebench`), each in a child process, so an engine that crashes this host's runtime is
a finding, not a crash of ``verify``."""

from __future__ import annotations

import importlib
import logging
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from dossier.bundle import Bundle
from dossier.errors import InputError
from dossier.measure.figure import speedup_text
from dossier.trial import Comparison
from dossier.verify.report import Rebench, Recheck

if TYPE_CHECKING:
    from dossier.jobs.worker import WorkerRequest
    from dossier.measure.latency import RouteLatency
    from dossier.measure.timing import TimingSettings

logger = logging.getLogger(__name__)


class _Lazy:
    """A module imported on first use: the re-timing's procedure (:mod:`dossier.measure.confirmation`)
    brings the validation-set readers (numpy, pyarrow), which verifying and loading do not
    need."""

    def __init__(self, name: str) -> None:
        self._name = name

    def __getattr__(self, attr: str) -> Any:
        return getattr(importlib.import_module(self._name), attr)


confirmation = _Lazy("dossier.measure.confirmation")
_timing = _Lazy("dossier.measure.timing")


def flatten(*args: Any, **kwargs: Any) -> Any:
    """:func:`dossier.measure.timing.flatten` (imported when first called)."""
    return _timing.flatten(*args, **kwargs)


def summarize(*args: Any, **kwargs: Any) -> Any:
    """:func:`dossier.measure.timing.summarize` (imported when first called)."""
    return _timing.summarize(*args, **kwargs)



def _request(bundle: Bundle, work: Path, timing: TimingSettings, **kw: Any) -> WorkerRequest:
    from dossier.jobs.requests import new_request

    header = bundle.tuning_cache().header
    s = bundle.manifest.summary
    return new_request(bundle.manifest.backend, bundle.folder("validation"), timing, work=work,
                       accuracy=(s.metric, s.threshold, s.atol, s.rtol),
                       baseline_route=s.baseline_route, builder=header.builder,
                       shapes=header.shapes, **kw)


def has_holdout(bundle: Bundle) -> bool:
    """Whether the bundle carries a hold-out set (``holdout/``)."""
    return any(f.path.startswith("holdout/") for f in bundle.manifest.files)


RECHECK_MAX_S = 600.0
"""Default bound on each ``verify --recheck`` process (``--recheck-max-s``)."""


def recheck(bundle: Bundle, *, threshold: float | None = None,
            data_set: Literal["validation", "holdout"] = "validation",
            max_s: float = RECHECK_MAX_S) -> Recheck:
    """Run the validation set (or the hold-out set) through the shipped engine here, in a
    child process given at most ``max_s`` seconds (the bundle's own trial timeout when
    shorter); InputError (exit 3) when it runs out of ``max_s``."""
    from dossier.jobs.child import run_child
    from dossier.jobs.worker import JudgedResult

    s = bundle.manifest.summary
    shipped = bundle.manifest.engines.shipped
    if not (bundle.folder(data_set)).is_dir():
        raise InputError(f"{bundle.source} has no {data_set} set (imported from trtexec?): "
                         "--recheck has nothing to run")
    limit = threshold if threshold is not None else s.threshold
    cache = bundle.tuning_cache()
    header = cache.header
    if data_set == "holdout":
        held = cache.decision.holdout if cache.decision else None
        recorded = held.worst_loss if held is not None else None
    else:
        recorded = next((t.worst_loss for t in cache.trials
                         if t.index == shipped.trial_index), None)
    with tempfile.TemporaryDirectory(prefix="dossier-verify-") as tmp:
        timing = header.timing.model_copy(update={
            "trial_timeout_s": min(header.timing.trial_timeout_s, max_s)})
        req = _request(bundle, Path(tmp), timing, mode="validate",
                       engine=str(bundle.file(shipped.path)), route=shipped.route)
        req = req.model_copy(update={"threshold": limit,
                                     "validation": str(bundle.folder(data_set))})
        result = run_child(req, Path(tmp), "recheck",
                           _loader_env(bundle, bundle.file(shipped.path)))
    if getattr(result, "outcome", None) == "timeout" and max_s < header.timing.trial_timeout_s:
        raise InputError(f"--recheck did not finish on the {data_set} set within "
                         f"{timing.trial_timeout_s:g} s", hint="give it more time with "
                         "--recheck-max-s")
    if not isinstance(result, JudgedResult):
        failure = getattr(result, "reason", None) or "the engine did not run"
        return Recheck(passed=False, metric=s.metric, threshold=limit, failure=failure,
                       recorded_worst_loss=recorded, data_set=data_set)
    return Recheck(passed=result.outcome == "ok", metric=s.metric, threshold=limit,
                   failure=result.reason, losses=result.losses, worst_loss=result.worst_loss,
                   recorded_worst_loss=recorded, data_set=data_set)


def _loader_env(bundle: Bundle, *engines: Path) -> dict[str, str]:
    """What the child that loads ``engines`` needs in its environment (backend-specific)."""
    from dossier.backends import get_backend

    try:
        backend = get_backend(bundle.manifest.backend)
    except InputError:
        return {}
    return backend.loader_env(*engines)




def judge_speedup(here: Comparison | None, recorded: float | None, low: float | None,
                  high: float | None) -> list[str]:
    """Why a re-measured speedup is a regression against the recorded one (empty: it is not):
    it lies below ``low`` (the recorded prediction interval's lower end; in older bundles the
    recorded interval's, whose upper end its interval had to reach), or its interval no longer
    excludes 1.0."""
    if here is None or recorded is None or low is None or high is None:
        return []
    now = speedup_text(here.speedup, here.speedup_ci_low, here.speedup_ci_high)
    was = speedup_text(recorded, low, high)
    below = here.speedup < low if here.processes else here.speedup_ci_high < low
    if below:
        return [f"its speedup over the baseline fell to {now}, below the recorded {was}"]
    if here.speedup_ci_low <= 1.0:
        return [f"its speedup over the baseline here, {now}, no longer excludes 1.0 "
                f"(recorded {was})"]
    return []


OVERSTATED = 2.0
"""A recorded speedup this many times what a re-measurement reads must not pass: a record
whose prediction interval would still hold a reading this far below it cannot be checked
(:func:`judge_record`)."""


def judge_record(here: Comparison | None, recorded: float | None, ci_low: float | None,
                 ci_high: float | None, predicted_low: float | None) -> list[str]:
    """Why the recorded figure fails the re-measurement as a record (empty: it does not):
    the interval read here lies wholly below the recorded interval (the record is not
    reproduced: overstated, or the host lost the gain), or the record cannot be checked: its
    prediction interval for a new process reaches down to 1 / :data:`OVERSTATED` of the
    recorded speedup, so a figure overstated that much would still read inside it."""
    if here is None or recorded is None or ci_low is None or ci_high is None:
        return []
    out = []
    now = speedup_text(here.speedup, here.speedup_ci_low, here.speedup_ci_high)
    if here.speedup_ci_high < ci_low:
        out.append(f"the recorded {speedup_text(recorded, ci_low, ci_high)} is not reproduced "
                   f"here: {now} lies wholly below it (overstated by "
                   f"{recorded / here.speedup:.2g}x, or this host lost the gain)")
    if predicted_low is not None and predicted_low <= recorded / OVERSTATED:
        out.append(f"the record cannot be checked: its prediction interval for a new process "
                   f"starts at {predicted_low:.3f}x, at or below half its "
                   f"{recorded:.3f}x, so a figure overstated {OVERSTATED:g}x would read inside "
                   "it; re-establish it with dossier release on a host as quiet as its "
                   "[target] declares ([timing] quiet_host = \"wait\")")
    return out


AGAIN = 2
"""A re-timing whose reading cannot tell (its interval holds 1.0) is read again over this many
times as many measuring processes, where ``--max-s`` leaves the time for it."""
REBENCH_MAX_S = 900.0
"""Default bound on the time ``verify --rebench`` spends measuring (``--max-s``)."""
REBENCH_LIMITS: dict[str, float] = {
    "confirm_processes": 20, "confirm_rounds": 50, "confirm_warmup": 200, "confirm_runs": 2000,
    "confirm_block_s": 2.0, "warmup_max_s": 10.0, "warmup_window": 100,
    "warmup_min_runs": 100, "trial_timeout_s": 600.0}
"""The most a re-measurement takes of each timing setting, whatever the bundle's tuning
header says (an unsigned bundle's header is anyone's): enough for the confirmation's
procedure, bounded."""


def rebench_timing(timing: TimingSettings, max_s: float = REBENCH_MAX_S) -> TimingSettings:
    """``timing`` with every setting a re-measurement uses clamped to :data:`REBENCH_LIMITS`,
    and each measuring process's time limit to its share of ``max_s``."""
    update: dict[str, Any] = {}
    for name, limit in REBENCH_LIMITS.items():
        value = getattr(timing, name)
        if value > limit:
            update[name] = type(value)(limit)
    processes = max(min(timing.confirm_processes, int(REBENCH_LIMITS["confirm_processes"])), 2)
    share = max_s / processes
    if min(timing.trial_timeout_s, REBENCH_LIMITS["trial_timeout_s"]) > share:
        update["trial_timeout_s"] = share
    return timing.model_copy(update=update)


MOVED = 0.10
"""An engine's median per inference that differs from its record by more than this share
has moved (:func:`moved_engine`)."""


def moved_engine(shipped_here: RouteLatency | None, shipped_then: RouteLatency | None,
                 base_here: RouteLatency | None, base_then: RouteLatency | None) -> str | None:
    """Which engine moved against its record, in words, when one did by more than
    :data:`MOVED` (the larger move when both did); None when neither did or a figure is
    missing. A speedup is baseline over shipped: a baseline that runs faster here than when
    tuned shrinks it with no change in the shipped engine, and the verdict beside it says the
    same numbers a reader can check."""
    import math

    figures = (shipped_here, shipped_then, base_here, base_then)
    if any(f is None or not f.median_ms > 0 for f in figures):
        return None
    assert shipped_here and shipped_then and base_here and base_then
    ship = math.log(shipped_here.median_ms / shipped_then.median_ms)
    base = math.log(base_here.median_ms / base_then.median_ms)
    limit = math.log1p(MOVED)
    if max(abs(ship), abs(base)) <= limit:
        return None
    name, change = ("the baseline", base) if abs(base) >= abs(ship) else \
        ("the shipped engine", ship)
    other = ship if name == "the baseline" else base
    held = (f", the {'shipped engine' if name == 'the baseline' else 'baseline'} "
            f"{abs(math.expm1(other)) * 100:.0f}% {'slower' if other > 0 else 'faster'}")
    return (f"{name} moved: {abs(math.expm1(change)) * 100:.0f}% "
            f"{'slower' if change > 0 else 'faster'} here than recorded{held}, so the speedup "
            f"moved with {name}")


def rebench(bundle: Bundle, timing: TimingSettings | None = None, *,
            max_s: float = REBENCH_MAX_S,
            scenario: Callable[[Bundle], Any] | None = None) -> Rebench:
    """Re-measure the shipped and the baseline engines here with the confirmation's procedure
    (:mod:`dossier.measure.confirmation`, ``confirm_processes`` measuring processes, production load
    options) and judge the shipped route by whether its speedup falls inside the prediction
    interval the confirmation recorded for a new process. Absolute latency is reported, not
    judged (it depends on the host).

    Bounded: the timing settings are clamped (:func:`rebench_timing`) and the measuring
    processes together take at most about ``max_s`` seconds. A bundle whose validation set
    cannot be read is BundleFormatError (exit 6); a measuring process that runs out of its
    share of ``max_s`` is InputError (exit 3: give more time); one that fails otherwise is
    EngineFailedError (exit 11). Its work folder, with the measuring processes' logs, is kept
    when it fails (the error names the log) and removed otherwise."""
    import math
    import shutil

    from dossier.errors import BundleFormatError, EngineFailedError, TuneError

    if not (math.isfinite(max_s) and max_s > 0):
        raise InputError(f"--max-s {max_s}: must be a number of seconds above 0")
    m = bundle.manifest
    cache = bundle.tuning_cache()
    timing = rebench_timing(timing or cache.header.timing, max_s)
    shipped, base = m.engines.shipped, m.engines.baseline
    if base is None:
        raise InputError(f"{bundle.source} has no baseline engine (imported from trtexec?): "
                         "--rebench cannot compare against the baseline")
    if not (bundle.folder("validation")).is_dir():
        raise InputError(f"{bundle.source} has no validation set to time the engines on")
    from dossier.validation import load_validation_set

    try:
        load_validation_set(bundle.folder("validation"))
    except InputError as exc:  # the bundle's own files: not the user's input
        raise BundleFormatError(f"{bundle.source}: its validation set cannot be read, so its "
                                f"engines cannot be timed: {exc.diagnostics()}") from exc
    same = shipped.trial_index == base.trial_index
    baseline = (bundle.file(base.path), base.route)
    others = [] if same else [(bundle.file(shipped.path), shipped.route)]
    work = Path(tempfile.mkdtemp(prefix="dossier-rebench-"))
    confirmed = [t.comparison for t in cache.trials if t.role == "confirm"
                 and t.route == shipped.route and t.comparison is not None]
    rec = confirmed[-1] if confirmed else None
    target = cache.header.spec.target
    from dossier.measure.target import problems_here

    unfit = problems_here(target)  # an unsigned bundle's header is anyone's: no load beyond it
    if unfit:
        raise InputError(f"--rebench cannot re-measure {bundle.source} as its [target] declares "
                         f"here: {'; '.join(unfit)}",
                         hint="re-measure on a host that has what the target declares")
    again = ""
    try:
        from dossier.jobs import measuring
        from dossier.jobs.cotenants import cotenants
        from dossier.jobs.placement import placed

        # like with like: the record's declared conditions (its cores, its priority, its
        # co-tenant load) and its estimator (a record read of 10th percentiles is re-read so)
        started = time.perf_counter()
        n = 2 if same else max(timing.confirm_processes, 2)
        with placed(target) as where, cotenants(target.co_tenants, where.cores, max_s * 2):
            def reading(processes: int) -> Any:
                measure = measuring.local_processes(
                    m.backend, bundle.path / "validation", timing,
                    builder=cache.header.builder, shapes=cache.header.shapes, work=work,
                    env=_loader_env(bundle, baseline[0], *(e for e, _ in others)))
                # the baseline shipping: no speedup to judge, only its latency (two do)
                return confirmation.confirm(
                    baseline, others, timing, measure, fixed=processes,
                    estimator="p10" if rec is not None and rec.estimator == "p10" else "auto")

            result = reading(n)
            first = result.candidates[0].comparison if others else None
            spent = time.perf_counter() - started
            # a reading too noisy to tell (its interval holds 1.0 while its estimate does
            # not) is read again, from scratch, over AGAIN times as many processes, where
            # --max-s leaves the time: the second reading is the one judged
            if first is not None and first.speedup_ci_low <= 1.0 < first.speedup \
                    and spent * (AGAIN + 1) <= max_s:
                result = reading(n * AGAIN)
                again = (f"the first reading, {first.text()} over {n} processes, could not "
                         f"tell (its interval holds 1.0): read again over {n * AGAIN}; ")
    except TuneError as exc:  # a measuring process failed: its log is kept where it says
        why = exc.diagnostics()
        if "ended timeout" in str(exc):
            raise InputError(f"--rebench did not finish: {why}", hint=(
                f"each measuring process had {timing.trial_timeout_s:g} s (--max-s "
                f"{max_s:g} over {max(timing.confirm_processes, 2)} processes); give more "
                "time with --max-s")) from exc
        raise EngineFailedError(f"--rebench: the engines could not be timed here: {why}") \
            from exc
    except BaseException:
        shutil.rmtree(work, ignore_errors=True)
        raise
    shutil.rmtree(work, ignore_errors=True)
    base_s = flatten(result.aa.baseline)[0]
    base_here = summarize(base_s, timing.confidence, result.aa.warmup_runs)
    track = result.candidates[0] if others else None
    ship_here = base_here if track is None else summarize(
        flatten(track.samples)[0], timing.confidence, track.warmup_runs)
    comp = track.comparison if track is not None else None
    recorded_trials = [t for t in cache.trials if t.route == shipped.route and t.timing]
    recorded = recorded_trials[-1].timing if recorded_trials else None
    s = m.summary
    p_lo = rec.prediction_low if rec is not None else None
    p_hi = rec.prediction_high if rec is not None else None
    from dossier.bundle.overview import decision_conditions
    from dossier.measure.conditions import summarize as summarize_conditions
    from dossier.measure.latency import of_route, per_inference

    pairs = cache.header.per_sample
    lat_here = per_inference(base_s if track is None else flatten(track.samples)[0], pairs,
                             route=shipped.route, source="confirmation", trial_index=-1)
    lat_then = of_route(cache.trials, shipped.route, m.summary.baseline_route, pairs)
    base_lat_here = per_inference(base_s, pairs, route=base.route, source="confirmation",
                                  trial_index=-1)
    base_lat_then = of_route(cache.trials, base.route, m.summary.baseline_route, pairs)
    moved = None if same else moved_engine(lat_here, lat_then, base_lat_here, base_lat_then)
    cond_here = summarize_conditions(result.conditions)
    cond_then, _ = decision_conditions(list(cache.trials))
    latency = ((f"the shipped engine takes {lat_here.median_ms:.4g} ms per inference here "
                f"(p99 {lat_here.p99_ms:.4g} ms)" if lat_here is not None else
                "the shipped engine was not timed here")
               + (f" (recorded {lat_then.median_ms:.4g} ms per inference, "
                  f"{'confirmation' if lat_then.source == 'confirmation' else 'screening only'})"
                  if lat_then is not None else ""))
    if not same and base_lat_here is not None:
        latency += (f"; the baseline {base_lat_here.median_ms:.4g} ms per inference here"
                    + (f" (recorded {base_lat_then.median_ms:.4g} ms)"
                       if base_lat_then is not None else ""))
    if moved is not None:
        latency += f"; {moved}"
    if cond_here is not None and cond_then is not None and \
            (cond_here.busy > 0) != (cond_then.busy > 0):
        latency += (f"; measured on a {'busy' if cond_here.busy else 'quiet'} host here, a "
                    f"{'busy' if cond_then.busy else 'quiet'} one when tuned: not like with like")
    if p_lo is not None and p_hi is not None and s.speedup is not None:
        reasons = judge_speedup(comp, s.speedup, p_lo, p_hi)
    else:
        reasons = judge_speedup(comp, s.speedup, s.speedup_ci_low, s.speedup_ci_high)
    record = judge_record(comp, s.speedup, s.speedup_ci_low, s.speedup_ci_high, p_lo)
    reasons += [r for r in record if r not in reasons]
    inside = (None if comp is None or p_lo is None or p_hi is None
              else p_lo <= comp.speedup <= p_hi)
    if comp is None:
        verdict = "the baseline ships: nothing to compare"
    else:
        verdict = (f"{speedup_text(comp.speedup, comp.speedup_ci_low, comp.speedup_ci_high)} the "
                   f"baseline ({comp.processes} measuring processes, "
                   f"{'10th percentiles' if comp.estimator == 'p10' else 'medians'} per block)"
                   + ("" if p_lo is None or p_hi is None else
                      f", {'inside' if inside else 'outside'} the recorded prediction interval "
                      f"[{p_lo:.3f}, {p_hi:.3f}] for a new process")
                   + ("" if s.speedup is None or s.speedup_ci_low is None
                      or s.speedup_ci_high is None else
                      f", recorded {speedup_text(s.speedup, s.speedup_ci_low, s.speedup_ci_high)}"))
    reason = again + ("regression: " + "; ".join(reasons) + f"; {latency}" if reasons
                      else f"{verdict}; {latency}; no regression")
    # a server/offline release: its scenario replayed by LoadGen, handed in by the caller
    # (dossier.scenarios.replay.rebench_scenario: the scenarios load engines through
    # dossier.load, which verifies them, so verify does not import them)
    replayed = scenario(bundle) if scenario is not None else None
    if replayed is not None:
        reason = (f"regression: scenario {replayed.text}; {reason.removeprefix('regression: ')}"
                  if replayed.regression else f"{reason}; scenario {replayed.text}")
        reasons = reasons or ([replayed.text] if replayed.regression else [])
    return Rebench(shipped=ship_here, baseline=base_here, comparison=comp,
                   recorded_shipped=recorded, predicted_low=p_lo, predicted_high=p_hi,
                   inside=inside, regression=bool(reasons), reason=reason, latency=lat_here,
                   recorded_latency=lat_then, baseline_latency=base_lat_here,
                   recorded_baseline_latency=base_lat_then, moved=moved, conditions=cond_here,
                   recorded_conditions=cond_then, unverifiable=any(
                       r.startswith("the record cannot be checked") for r in record),
                   overstated=any(r.startswith("the recorded") for r in record),
                   target=target.text())
