"""The confirmation: the measurement that decides whether a screened candidate ships.

**The process is the unit; the pairing is inside it.** Each *measuring process* (a worker in
``measure`` mode, :func:`dossier.jobs.worker.run_measure`) loads the baseline, a second load of the
baseline (the A/A) and the candidates still undecided, in production load configuration, and
times them in ``confirm_rounds`` rounds of one block each, the first engine rotating from round
to round and from process to process. A process gives one observation per engine: its log
speedup over the baseline (:func:`dossier.measure.timing.process_log`). A candidate's observation is
the *difference* between its log speedup and the A/A's in the same process, so whatever two
loads of one engine read apart in that process (co-residence, position, the process's state)
cancels, and the null hypothesis is exactly "the candidate is another load of the baseline".

Processes run one after another. After ``confirm_processes`` of them, and at about 1.5 times as
many each time after that up to ``confirm_max_processes`` (the *looks*,
:meth:`~dossier.measure.timing.TimingSettings.looks`), every undecided candidate is tested: Student's t,
one-sided, of "its mean log difference is at most log(1 + min_effect)", at
``alpha / (m x L)``: Bonferroni over the L looks, the plainest alpha-spending (stopping early
cannot raise the false-positive rate above alpha), and Holm's step-down over the candidates: m
is the number of candidates not confirmed yet, k at first, and each confirmation frees its
share for the others, tested again at the same look (a closed test whose every intersection is
a Bonferroni test over its candidates and the looks: the chance that any candidate without the
gain is confirmed stays at most alpha). A candidate whose p is below its level and whose
interval excludes 1.0 is *confirmed*; one whose interval
lies wholly below 1 + min_effect is *futile* (no later look could ship it honestly; dropping it
only lowers the false-positive rate); one whose interval lies wholly below the interval of a
confirmed candidate that may ship (``may_ship``: the tuner's hold-out check) is *outranked*: the
rule ships the largest confirmed speedup, so it could ship only if a later look read it above
its own interval's upper end, and the candidate above it failed nothing. It is outranked too
when, *paired* with that confirmed candidate process by process (the processes both were timed
in), the interval of its log speedup over the confirmed one's lies wholly below
log(1 + min_effect): it is not faster than a route that ships by any effect the rule counts,
and the host's state, which moves both alike from process to process, cancels in the pairing
(two int8 routes 6% apart, each read over a 30% wide interval, held the tblock sample's
confirmation to 8 processes). Neither drop can ship anything: only a confirmed candidate
ships, by its own test. All three leave the
later processes (racing's elimination: a candidate three times slower than the confirmed one
no longer holds the measurement to the cap). The confirmation stops when every candidate is
decided, or at the cap, and says which.

Each reading records the prediction interval for one new process: what ``verify --rebench``
(the same procedure, on the target host) is expected to read.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from statistics import median
from typing import TYPE_CHECKING, Literal, Protocol

from dossier.measure import conditions as host
from dossier.measure.conditions import Conditions
from dossier.measure.reading import Comparison, log_effect
from dossier.measure.record import Outcome, TrialRecord
from dossier.measure.target import estimator_for
from dossier.measure.timing import (
    ROBUST,
    Estimator,
    TimingSettings,
    flatten,
    process_compare,
    process_log,
    process_stats,
    round_ratios,
    summarize,
)

if TYPE_CHECKING:
    pass

logger = logging.getLogger(__name__)

Status = Literal["confirmed", "futile", "outranked", "undecided"]


@dataclass
class ProcessRun:
    """What one measuring process timed: samples per engine (in the order asked), per round,
    and each engine's warm-up runs."""

    rounds: list[list[list[float]]]
    warmup_runs: list[int]
    wall_s: float
    """From the parent's asking to its result (a process started ahead: from its turn)."""
    phases_s: dict[str, float] = field(default_factory=dict)
    """Seconds per stage of the process, as it reported them (startup, setup, standby, load,
    warm, time...)."""
    waited_share: float | None = None
    """Of its threads' ready time while timing, the share they waited for a core (None: not
    readable there)."""


class MeasureProcess(Protocol):
    """Runs one measuring process over ``engines`` ((path, route) each: the baseline, its
    second load, the candidates) with rotation offset ``offset``; ``more``: another process
    may follow this one. One with a ``close()`` method (a process started ahead of its turn)
    is closed when the confirmation ends; one whose ``on_this_host`` is true runs its
    processes on this host, whose conditions are then watched around each."""

    def __call__(self, engines: Sequence[tuple[Path, str]], offset: int, /, *,
                 more: bool = True) -> ProcessRun: ...


@dataclass
class Track:
    """One engine's readings across the measuring processes that timed it."""

    route: str
    logs: list[float] = field(default_factory=list)
    """Per process: the log speedup (a candidate: minus the A/A's in that process)."""
    samples: list[list[float]] = field(default_factory=list)
    """Its samples per round, over every process that timed it (in order)."""
    baseline: list[list[float]] = field(default_factory=list)
    """The baseline's samples of the same rounds."""
    ratios: list[float] = field(default_factory=list)
    """Per round: the baseline's block median over this engine's."""
    robust_logs: list[float] = field(default_factory=list)
    """``logs`` taken of each block's 10th percentile instead of its median (the reading of a
    confirmation whose host was busier than declared, :mod:`dossier.measure.target`)."""
    robust_ratios: list[float] = field(default_factory=list)
    """``ratios`` of the blocks' 10th percentiles."""
    estimator: Estimator = "median"
    """Which of the two the reading is taken with."""

    def readings(self) -> tuple[list[float], list[float]]:
        """(logs, ratios) of :attr:`estimator`."""
        if self.estimator == "median":
            return self.logs, self.ratios
        return self.robust_logs, self.robust_ratios
    warmup_runs: int = 0
    status: Status = "undecided"
    look: int | None = None
    """The look (process count) that decided it."""
    comparison: Comparison | None = None
    outranked_by: str | None = None
    """The confirmed route whose interval lay wholly above this one's, or which this one was not
    faster than by the minimum effect, paired process by process (status ``outranked``)."""


@dataclass
class Confirmation:
    """The outcome: the A/A's reading, each candidate's, and why the measurement stopped."""

    aa: Track
    candidates: list[Track]
    processes: int
    looks: list[int]
    level: float
    """The level of a look's first test of every candidate, alpha / (k x L); one tested again
    after others were confirmed is judged at a higher one (Holm), which its comparison
    records."""
    stopped: str
    wall_s: float
    phases_s: dict[str, float] = field(default_factory=dict)
    """Seconds per stage, summed over the measuring processes, and ``process``: their walls
    from their turns to their results."""
    conditions: list[Conditions] = field(default_factory=list)
    """What the host was doing during each measuring process, in order."""


def _add(track: Track, base: list[list[float]], own: list[list[float]], warm: int) -> None:
    track.samples.extend(own)
    track.baseline.extend(base)
    track.ratios.extend(median(b) / median(c) for b, c in zip(base, own) if b and c)
    track.robust_ratios.extend(float(r) for r in round_ratios(base, own, ROBUST))
    track.warmup_runs = max(track.warmup_runs, warm)


def decide_track(track: Track, settings: TimingSettings, level: float, *, aa: bool,
          baseline_warmup: int = 0) -> Comparison:
    """The reading of ``track`` so far, judged at ``level`` (the one judge of a confirmation
    reading: the tuner, ``verify --rebench`` and the benchmarks call it)."""
    base = [x for block in track.baseline for x in block]
    logs, ratios = track.readings()
    return process_compare(logs, base, settings, level=level, aa=aa, round_ratios_=ratios,
                           baseline_warmup=baseline_warmup, estimator=track.estimator)


def confirm(baseline: tuple[Path, str], candidates: Sequence[tuple[Path, str]],
            settings: TimingSettings, measure: MeasureProcess, *,
            on_process: Callable[[int, int, list[str]], None] | None = None,
            fixed: int | None = None,
            may_ship: Callable[[str], bool] | None = None,
            estimator: Estimator | Literal["auto"] = "auto") -> Confirmation:
    """Run measuring processes until every candidate is decided or the cap is reached (or
    exactly ``fixed`` processes, deciding once at the end: ``verify --rebench``).
    ``estimator``: ``auto`` takes every reading of block medians while the processes so far
    ran no busier than declared, of the blocks' 10th percentiles once one did
    (:func:`dossier.measure.target.estimator_for`); ``median`` or ``p10`` forces one (a
    re-measurement reads as its record did).
    ``on_process(n, cap, open_routes)`` is called after each process. ``may_ship(route)``:
    asked once of each confirmed route (None: every confirmed route may ship); only a route
    that may ship outranks others."""
    try:
        return _confirm(baseline, candidates, settings, measure, on_process, fixed,
                        may_ship or (lambda _route: True), estimator)
    finally:
        close = getattr(measure, "close", None)
        if callable(close):
            close()


def _confirm(baseline: tuple[Path, str], candidates: Sequence[tuple[Path, str]],
             settings: TimingSettings, measure: MeasureProcess,
             on_process: Callable[[int, int, list[str]], None] | None,
             fixed: int | None, may_ship: Callable[[str], bool],
             estimator: Estimator | Literal["auto"]) -> Confirmation:
    t0 = time.perf_counter()
    k = len(candidates)
    looks = [fixed] if fixed else settings.looks()

    def level_for(m: int) -> float:  # m: the candidates not confirmed yet
        return settings.alpha / max(m, 1) if fixed else settings.look_level(m)

    level = level_for(k)
    aa = Track(route=baseline[1])
    tracks = [Track(route=r) for _, r in candidates]
    open_ = list(range(k))
    bound = log_effect(settings.min_effect)
    n = 0
    stopped = ""
    phases: dict[str, float] = {}
    seen: list[Conditions] = []
    shippable: dict[str, bool] = {}
    while n < looks[-1]:
        engines = [baseline, baseline, *(candidates[j] for j in open_)]
        # the conditions of this host: where the processes run here (not on a cluster's node)
        watch = host.start(settings.quiet_host, settings.quiet_share, settings.quiet_wait_s) \
            if getattr(measure, "on_this_host", False) else None
        run = measure(engines, n, more=n + 1 < looks[-1])
        if watch is not None:
            watched = watch.stop()
            seen.append(watched if run.waited_share is None
                        else watched.model_copy(update={"waited_share": run.waited_share}))
        n += 1
        for key, value in [*run.phases_s.items(), ("process", run.wall_s)]:
            phases[key] = phases.get(key, 0.0) + value
        base, second = run.rounds[0], run.rounds[1]
        d_aa = process_log(base, second, settings.confidence)
        r_aa = process_log(base, second, settings.confidence, ROBUST)
        aa.logs.append(d_aa)
        aa.robust_logs.append(r_aa)
        _add(aa, base, second, run.warmup_runs[1])
        for pos, j in enumerate(open_):
            own = run.rounds[2 + pos]
            tracks[j].logs.append(process_log(base, own, settings.confidence) - d_aa)
            tracks[j].robust_logs.append(
                process_log(base, own, settings.confidence, ROBUST) - r_aa)
            _add(tracks[j], second, own, run.warmup_runs[2 + pos])
        # a process busier than the target declares: every reading from then on is taken of
        # the blocks' 10th percentiles (dossier.measure.target), the A/A's and the candidates'
        # alike, over every process so far
        est = estimator if estimator != "auto" else estimator_for(seen, settings.quiet_share)
        for t in (aa, *tracks):
            t.estimator = est
        if n in looks:
            # Holm's step-down: each confirmation frees its share of alpha for the candidates
            # not confirmed yet, which are tested again, at this look, at the level it gives
            confirmed = sum(t.status == "confirmed" for t in tracks)
            while True:
                for j in list(open_):
                    c = decide_track(tracks[j], settings, level_for(k - confirmed), aa=False)
                    tracks[j].comparison = c
                    if c.faster:
                        tracks[j].status, tracks[j].look = "confirmed", n
                    elif math.log(c.speedup_ci_high) < bound and not fixed:
                        tracks[j].status, tracks[j].look = "futile", n
                    if tracks[j].status != "undecided":
                        open_.remove(j)
                now = sum(t.status == "confirmed" for t in tracks)
                if now == confirmed or not open_:
                    break
                confirmed = now
            if not fixed:
                _outrank(tracks, open_, n, may_ship, shippable, settings)
        logger.info("confirmation: %d measuring process(es), %d undecided", n, len(open_))
        if on_process is not None:
            on_process(n, looks[-1], [tracks[j].route for j in open_])
        if not open_ and n in looks:
            stopped = (f"every candidate was decided after {n} measuring processes"
                       if k else f"{n} measuring processes")
            break
    if not stopped:
        stopped = (f"stopped at the cap of {n} measuring processes with "
                   f"{len(open_)} candidate(s) undecided" if open_ else
                   f"{n} measuring processes")
    aa.comparison = decide_track(aa, settings, settings.alpha, aa=True)
    return Confirmation(aa=aa, candidates=tracks, processes=n, looks=looks, level=level,
                        stopped=stopped, wall_s=time.perf_counter() - t0, phases_s=phases,
                        conditions=seen)


def paired_high(track: Track, top: Track, confidence: float) -> float | None:
    """The upper end of the ``confidence`` interval (Student's t over processes) of the mean
    log speedup of ``track`` over ``top``, process by process, over the processes both were
    timed in (the first ones: a decided candidate leaves the later ones; the A/A's term
    cancels in the difference); None with fewer than two."""
    mine, theirs = track.readings()[0], top.readings()[0]
    n = min(len(mine), len(theirs))
    if n < 2:
        return None
    return process_stats([a - b for a, b in zip(mine[:n], theirs[:n])], confidence).high


def _outrank(tracks: list[Track], open_: list[int], n: int, may_ship: Callable[[str], bool],
             shippable: dict[str, bool], settings: TimingSettings) -> None:
    """Mark (and take out of ``open_``) the undecided candidates whose interval lies wholly
    below the lower end of a confirmed candidate that may ship, or whose paired interval over
    it (:func:`paired_high`) lies wholly below log(1 + min_effect). The confirmed candidates
    are asked in the order of their lower ends, until one may ship; ``shippable`` keeps each
    answer, so ``may_ship`` is asked once per route at most."""
    if not open_:
        return
    confirmed = sorted((t for t in tracks if t.status == "confirmed" and t.comparison),
                       key=lambda t: -t.comparison.speedup_ci_low)  # type: ignore[union-attr]
    for top in confirmed:
        if top.route not in shippable:
            shippable[top.route] = may_ship(top.route)
        if shippable[top.route]:
            break
    else:
        return
    floor = top.comparison.speedup_ci_low  # type: ignore[union-attr]
    bound = log_effect(settings.min_effect)
    for j in list(open_):
        c = tracks[j].comparison
        high = paired_high(tracks[j], top, settings.confidence)
        if c is not None and (c.speedup_ci_high < floor or (high is not None and high < bound)):
            tracks[j].status, tracks[j].look, tracks[j].outranked_by = "outranked", n, top.route
            open_.remove(j)


def records(result: Confirmation, baseline: TrialRecord, chosen: Sequence[TrialRecord],
            settings: TimingSettings, first_index: int, started: str) -> list[TrialRecord]:
    """The confirmation trials a search records: the A/A's, then one per candidate judged
    (in the order of ``chosen``), numbered from ``first_index``."""
    out: list[TrialRecord] = []
    for t, track in [(baseline, result.aa), *zip(chosen, result.candidates)]:
        if track.comparison is None:  # never judged
            continue
        samples, rounds = flatten(track.samples)
        base_samples, base_rounds = flatten(track.baseline)
        out.append(TrialRecord(
            index=first_index + len(out), route=t.route, role="confirm", outcome=Outcome.OK,
            trial_s=result.wall_s, started_at=started, phases_s=result.phases_s,
            timing=summarize(samples, settings.confidence, track.warmup_runs),
            comparison=track.comparison, samples_ms=samples, baseline_samples_ms=base_samples,
            sample_rounds=rounds, baseline_sample_rounds=base_rounds, engine=t.engine,
            engine_digest=t.engine_digest, worst_loss=t.worst_loss, losses=t.losses,
            load=t.load, engine_flags=t.engine_flags, conditions=list(result.conditions) or None,
            extra={"confirmation": track.status, "decided_at": str(track.look or ""),
                   **({"outranked_by": track.outranked_by} if track.outranked_by else {})}))
    return out


def rule_text(settings: TimingSettings) -> str:
    """The confirmation's rule in words, with the numbers in force."""
    looks = settings.looks()
    return (f"measuring processes of their own, each timing the baseline, a second load of it "
            f"(the A/A) and the candidates in {settings.confirm_rounds} rotating rounds; a "
            f"candidate's observation per process is its log speedup minus the A/A's; looks "
            f"after {', '.join(map(str, looks))} processes; a candidate ships when Student's t "
            f"over processes, one-sided against the minimum effect of "
            f"{settings.min_effect:.0%}, has p below alpha/(m x {len(looks)} looks) (m: the "
            f"candidates not confirmed yet, Holm's step-down) and its "
            f"{settings.confidence:.0%} interval excludes 1.0; it is dropped when that interval "
            f"lies below 1 + the minimum effect, or below the interval of a confirmed candidate "
            f"that may ship, or when its speedup over that candidate, paired process by process, "
            f"lies below 1 + the minimum effect")
