"""Timing: warm-up, rounds of steady-state blocks, round-level statistics, the comparison.

The unit of replication is the **round**, not the sample: samples inside one block share its
state (caches, clock frequency, the other engine's threads), so a test over every sample of ten
rounds is not a ten-round test. In each round every engine is timed in one block (untimed
lead-in runs, then timed runs), the engines taking turns at going first (A B, B A, ...). Each
round gives one paired statistic, the ratio of the baseline's block median to the candidate's.
The speedup is the Hodges-Lehmann estimate of those ratios (on the log scale: the median of the
pairwise means of the log ratios), its interval the exact distribution-free interval that goes
with the Wilcoxon signed-rank test, and the test that signed-rank test on the log ratios. Raw
samples are kept with their round index.

The confirmation (:mod:`dossier.measure.confirmation`) has a unit above the round: the **process**.
Rounds timed by one process share its state, and on the H200 a launch-bound engine ran at one
of two speeds for a whole process. Each measuring process holds the baseline, a second load of
it (the A/A) and the candidates, and times them in rotating blocks; each process gives one log
speedup per engine (:func:`process_log`), and Student's t over processes
(:func:`process_stats`) gives the mean, its interval and the prediction interval for a new
process.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from dossier.measure.reading import (
    AHEAD,
    PROCESS_TEST,
    ROUNDS_TEST,
    Comparison,
    TimingSummary,
    effect_floor,
    log_effect,
    reaches_effect,
)

Timed = Callable[[int], float]
"""A function that runs the engine on input set ``i`` and returns the latency in ms."""

Engine = Callable[[], Timed]
"""Called when a block opens the engine (:func:`time_rounds`): the function to time in it."""

TEST_NAME = ROUNDS_TEST
"""``Comparison.test`` of a round-level comparison (screening): the reading's name for it."""

Estimator = Literal["median", "p10"]
"""The statistic of each block a round's ratio is taken of: ``median``, or ``p10`` (the
block's 10th percentile). Timing noise from other processes only adds time (preemption,
evicted caches), so a low quantile of a block estimates what the engine takes when nothing
else runs more stably than its median (Chen and Revels, "Robust benchmarking in noisy
environments", 2016, the estimator behind Julia's BenchmarkTools); a quantile rather than the
minimum, so that one lucky run does not make the figure. The decision uses ``p10`` when a
measurement was busier than the target declares (:func:`dossier.measure.target.estimator_for`),
the median otherwise (the calibrated rule on a quiet host)."""

ROBUST: Estimator = "p10"
"""The estimator a busier-than-declared measurement is read with."""

BLOCK_QUANTILE = {"median": 50.0, "p10": 10.0}
"""The percentile of each block each estimator takes."""

RETIRED = ("bootstrap_resamples",)
"""Settings of older tuning caches that are read and ignored."""


TIMING_MAXIMA: dict[str, float] = {
    "samples": 1_000_000, "rounds": 1000, "race_rounds": 1000, "block_warmup": 100_000,
    "block_warmup_s": 3600.0,
    "warmup_min_runs": 100_000,
    "warmup_window": 100_000, "warmup_window_s": 3600.0, "warmup_tolerance": 1.0,
    "warmup_max_s": 3600.0,
    "min_effect": 10.0, "trial_timeout_s": 7 * 86400.0,
    "trial_memory_limit_mb": 1 << 24, "confirm_top": 1000, "confirm_floor": 1.0, "confirm_rounds": 1000,
    "confirm_warmup": 1_000_000, "confirm_runs": 1_000_000, "confirm_block_s": 3600.0,
    "confirm_processes": 1000, "confirm_max_processes": 1000,
}
"""The largest value of each ``[timing]`` setting (rounds: 2**rounds must stay a float;
the memory limit: 16 TiB, within what setrlimit takes; the timeout: a week)."""
TIMING_INT_MAX = 10**9
"""Any other integer ``[timing]`` setting (one this table does not name) at most."""


class TimingSettings(BaseModel):
    """How trials are timed and compared. The same settings apply to baseline and candidates."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    samples: int = Field(320, ge=5)
    """Timed runs per engine per trial, split evenly into one block per round."""
    rounds: int = Field(16, ge=2)
    """Rounds of a screening trial: the unit of replication. Engines alternate order from
    round to round. The smallest two-sided p of the signed-rank test is 2 / 2**rounds, so
    ``dossier tune`` refuses rounds that cannot reach alpha."""
    inputs: Literal["shapes", "pairs"] = "shapes"
    """What one timed sample runs. ``shapes``: one inference per input shape of the validation
    set (pairs sharing their input names, shapes and dtypes take turns from sample to sample,
    so the inputs still rotate): a model with one input shape is timed one inference a sample,
    however many pairs the accuracy filter needs. ``pairs``: one pass over every pair's inputs
    (for a model whose time depends on the values, not only the shapes; what records from
    before this setting hold). Every latency is a sample divided by its inferences."""
    race_rounds: int = Field(3, ge=0)
    """Racing: a screening trial may stop once it has timed this many rounds (0: every trial
    times every round). It stops when its route cannot go to the confirmation: its interval
    so far lies wholly below the bar its request names (``confirm_floor``, or the lowest
    lower end of the ``confirm_top`` routes screened fastest so far, whichever is higher:
    :func:`dossier.decision.race_bar`). It stops *ahead* when that interval lies wholly above
    both the bar and 1 + ``min_effect`` (it goes to the confirmation, which measures it
    again). A route the accuracy filter rejected stops after 2 rounds (its speed is timed
    only for the trade's picture). Over fewer than six rounds the interval is the range of
    the round ratios, so every round so far must read below the bar (or above it). 1 is
    refused."""
    block_warmup: int = Field(5, ge=0)
    """Untimed lead-in runs at the start of every block, so the engine that ran just before
    (its threads, its data in the caches) does not colour the block."""
    block_warmup_s: float = Field(0.25, ge=0)
    """The lead-in stops after this many seconds, once one run is done: an engine whose run
    (a timed sample) takes 250 ms has the engine before it out of its caches
    after one, and five of them cost more than its timed share of a block (0: the
    ``block_warmup`` runs, however long)."""
    warmup_min_runs: int = Field(5, ge=1)
    """Warm-up runs at least."""
    warmup_window: int = Field(10, ge=2)
    """Warm-up is over when the medians of two successive windows of this many runs agree."""
    warmup_window_s: float = Field(0.5, ge=0)
    """A warm-up window holds at most this many seconds of runs (at least 2 runs), judged on
    the first ``warmup_min_runs``: ten 200 ms passes of a CPU engine are two seconds a window,
    and two windows per engine per trial and per measuring process (0: ``warmup_window``
    runs, however long)."""
    warmup_tolerance: float = Field(0.05, gt=0)
    """Relative difference of the two window medians that counts as stable."""
    warmup_max_s: float = Field(3.0, gt=0)
    """Give up waiting for stability after this long (and record that)."""
    confidence: float = Field(0.95, gt=0.5, lt=1)
    """Confidence level of every interval."""
    alpha: float = Field(0.05, gt=0, lt=1)
    """Significance level of the signed-rank test."""
    min_effect: float = Field(0.02, ge=0)
    """A candidate must be at least this much faster (0.02 = 2%) to count as a gain."""
    trial_timeout_s: float = Field(600.0, gt=0)
    """Wall-clock limit of one trial (build, validation and timing) in its own process, and of
    one measuring process of the confirmation."""
    trial_memory_limit_mb: int | None = Field(None, ge=64)
    """Address-space limit of a trial's process and of a measuring process (None: no limit);
    exceeding it is recorded."""
    confirm_top: int = Field(3, ge=0)
    """How many of the best screened candidates the confirmation re-measures (0: screening
    decides alone)."""
    confirm_floor: float = Field(0.7, ge=0, le=1)
    """A route whose screened interval lies wholly below this speedup (its upper end below
    0.7x) does not go to the confirmation: no screening bias seen makes such a route a gain
    (the largest, on a loaded host, was 1.27x: a real 1.25x gain screened 0.985x), and its
    confirmation would spend minutes to say so. 0 sends every admissible route."""
    confirm_rounds: int = Field(6, ge=2)
    """Rounds inside each measuring process of the confirmation: every engine (the baseline, a
    second load of it, the candidates) times one block per round, in rotating order. The
    process is the unit of the test, so rounds only steady its one observation; 6 (12 until
    the known-gain and A/A calibration of 2026-12-05) halves a process's time."""
    confirm_warmup: int = Field(10, ge=0)
    """Untimed lead-in runs before every confirmation block."""
    confirm_runs: int = Field(40, ge=5)
    """Timed runs per engine per confirmation block (at most; see confirm_block_s)."""
    confirm_block_s: float = Field(0.1, gt=0)
    """A confirmation block stops after this many seconds of timed runs (with at least 10)."""
    confirm_processes: int = Field(3, ge=1)
    """Measuring processes at the confirmation's first look. Each process gives one
    observation per engine, so this is the smallest sample the decision is taken on; the
    looks after it come at about 1.5 times as many processes each, up to
    ``confirm_max_processes`` (:meth:`looks`: 3, 5, 8, 12, 18, 20). A clear gain is decided
    at 3 (Student's t over 3 processes needs t above about 13 at the level of 3 candidates
    and 6 looks, which a steady gain reaches many times over); a noisy one waits for a later
    look, whose level the Bonferroni split keeps. At least 2 (a t-test needs a spread); older
    records hold 1 or 3 (their process generations) or 5 (the first look until 2026-12-05)."""
    confirm_max_processes: int = Field(20, ge=1)
    """The cap: a confirmation still undecided after this many processes stops and says so."""
    confirm_prestart: bool | None = None
    """Start each measuring process's successor as it begins: the successor runs its
    interpreter start and imports (``import torch`` takes seconds) while this one loads its
    engines, this one starts timing only once those imports are done, and the successor loads
    nothing until this one has ended, so processes still time one at a time. None: as the
    backend says (on for engines whose loads take seconds: AOTInductor, TensorRT)."""
    quiet_host: Literal["off", "wait", "refuse"] = "off"
    """Before each search trial and each measuring process, watch the host for a second:
    ``off`` measures whatever the host does (the conditions are recorded all the same);
    ``wait`` waits until other processes keep less than ``quiet_share`` of the cores busy (at
    most ``quiet_wait_s``, then stops the search); ``refuse`` stops the search at once on a
    busy host."""
    quiet_share: float = Field(0.25, gt=0, le=1)
    """The share of the cores other processes may keep busy on a quiet host; a measurement
    above it is recorded as busy."""
    quiet_wait_s: float = Field(600.0, ge=0)
    """With ``quiet_host = "wait"``: how long to wait for a quiet host before stopping."""
    trial_prestart: bool | None = None
    """The same for the search's trial processes: as each trial begins, the next trial's
    process starts and imports its runtime, then waits, loading nothing, for its turn; this
    trial starts timing only once those imports are done. None: as the backend says (as for
    ``confirm_prestart``)."""

    @field_validator("race_rounds")
    @classmethod
    def _race_on_an_interval(cls, v: int) -> int:
        if v == 1:
            raise ValueError("one round is no interval to race on: use at least 2 (0: no racing)")
        return v

    @model_validator(mode="before")
    @classmethod
    def _drop_retired(cls, data: Any) -> Any:
        """Settings of older records that no longer mean anything are read and dropped."""
        if isinstance(data, dict):
            return {k: v for k, v in data.items() if k not in RETIRED}
        return data

    def out_of_bounds(self) -> str | None:
        """What is not a finite number, or is above its maximum (:data:`TIMING_MAXIMA`; the
        lower bounds are the fields' own), in one line; None when every setting is within."""
        for name, value in self.model_dump().items():
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                continue
            if not math.isfinite(value):
                return f"timing.{name} = {value} is not a finite number"
            limit = TIMING_MAXIMA.get(name, TIMING_INT_MAX if isinstance(value, int)
                                      else math.inf)
            if value > limit:
                return f"timing.{name} = {value:.10g} is more than its maximum {limit:.10g}"
        return None

    def looks(self) -> list[int]:
        """Process counts at which the confirmation decides: ``confirm_processes``, then about
        1.5 times as many each time, the last at ``confirm_max_processes``."""
        cap = max(self.confirm_max_processes, self.confirm_processes)
        out = [self.confirm_processes]
        while out[-1] < cap:
            out.append(min(cap, math.ceil(out[-1] * 1.5)))
        return out

    def look_level(self, candidates: int) -> float:
        """The level a look tests a candidate at while ``candidates`` are not confirmed yet:
        alpha / (m x L), Bonferroni over the L looks (the simplest alpha-spending: every look
        spends the same) and Holm's step-down over the m candidates."""
        return self.alpha / (max(candidates, 1) * len(self.looks()))

    def smallest_p(self, rounds: int) -> float:
        """The smallest two-sided p-value an exact signed-rank test over ``rounds`` can give."""
        return 2.0 / float(2 ** rounds)

    def problems(self) -> list[str]:
        """What makes these settings unable to ship a gain (empty when nothing does)."""
        out = []
        if self.smallest_p(self.rounds) >= self.alpha:
            out.append(f"timing.rounds={self.rounds} cannot reach p < alpha={self.alpha:g} "
                       f"(smallest p {self.smallest_p(self.rounds):.2g})")
        if self.confirm_top and self.confirm_processes < 2:
            out.append(f"timing.confirm_processes={self.confirm_processes}: the confirmation "
                       "needs at least 2 measuring processes (its test is over processes)")
        if self.confirm_max_processes < self.confirm_processes:
            out.append(f"timing.confirm_max_processes={self.confirm_max_processes} is less "
                       f"than timing.confirm_processes={self.confirm_processes}")
        return out


def warm_up(fn: Timed, settings: TimingSettings, n_inputs: int) -> int:
    """Run ``fn`` until two successive windows have medians within the tolerance; return runs.
    A window is ``warmup_window`` runs, or fewer (at least 2) where that many would last more
    than ``warmup_window_s`` at the median of the first ``warmup_min_runs``."""
    start = time.perf_counter()
    times: list[float] = []
    w = settings.warmup_window
    while True:
        times.append(fn(len(times) % n_inputs))
        if len(times) == settings.warmup_min_runs and settings.warmup_window_s:
            per_run_s = float(np.median(times)) / 1e3
            if per_run_s * w > settings.warmup_window_s:
                w = max(2, int(settings.warmup_window_s / per_run_s))
        if len(times) >= max(settings.warmup_min_runs, 2 * w):
            a = float(np.median(times[-2 * w:-w]))
            b = float(np.median(times[-w:]))
            if abs(a - b) <= settings.warmup_tolerance * max(a, b, 1e-9):
                return len(times)
        if time.perf_counter() - start > settings.warmup_max_s and len(times) >= settings.warmup_min_runs:
            return len(times)


def warm_up_each(engines: Sequence[Engine], settings: TimingSettings, n_inputs: int) -> list[int]:
    """:func:`warm_up` every engine in turn (each opened for it); return each one's runs."""
    return [warm_up(e(), settings, n_inputs) for e in engines]


def block_sizes(settings: TimingSettings) -> list[int]:
    """Timed runs per block, one block per round (``samples`` split as evenly as possible)."""
    n, r = settings.samples, settings.rounds
    return [max(n // r + (1 if i < n % r else 0), 1) for i in range(r)]


MIN_BLOCK_RUNS = 10
"""Timed runs a block bounded in seconds (``confirm_block_s``) takes however long they last."""


Stop = Callable[[Sequence[Sequence[Sequence[float]]]], bool]
"""Asked after every round with the samples so far (per engine, per round): stop here?"""


REJECTED_ROUNDS = 2
"""Rounds a route the accuracy filter rejected is timed, when racing is on: the fewest that
give a speedup with a range (what the trade's picture shows of it)."""


class Race:
    """When a screening trial stops before its last round (``race_rounds``): called after each
    round with the samples so far (the candidate's first, the baseline's second), it answers
    whether to stop, and then says why in :attr:`reason`. ``below``: the bar the trial's
    interval must lie wholly under to be raced out, and ``why`` what that bar is; a trial whose
    interval lies wholly above both the bar and 1 + ``min_effect`` stops too, *ahead*: more
    rounds would only narrow an interval the confirmation re-measures anyway; ``rejected``:
    the accuracy filter rejected the route: it can never ship, and it stops after
    :data:`REJECTED_ROUNDS` whatever it reads (its speed is timed only for the trade's picture).
    No bar (no confirmation to race for, or racing off): every round is timed."""

    def __init__(self, settings: TimingSettings, *, below: float | None = None,
                 why: str = "", rejected: bool = False) -> None:
        self.settings, self.below, self.why, self.rejected = settings, below, why, rejected
        self.reason: str | None = None

    def __call__(self, rounds: Sequence[Sequence[Sequence[float]]]) -> bool:
        s = self.settings
        done = min(len(r) for r in rounds)
        if not s.race_rounds or done >= s.rounds:
            return False
        of = f"{done} of {s.rounds} rounds"
        if self.rejected and done >= REJECTED_ROUNDS:
            self.reason = f"rejected for accuracy: timed {of}, for its speed only"
            return True
        if done < s.race_rounds:
            return False
        if self.below is None:
            return False
        _, lo, hi = shift_interval(np.log(round_ratios(rounds[1], rounds[0])), s.confidence)
        if math.exp(hi) < self.below:
            self.reason = (f"raced out after {of}: its interval so far ends at "
                           f"{math.exp(hi):.3f}x, below {self.below:.3f}x ({self.why})")
            return True
        floor = effect_floor(s.min_effect)
        if math.exp(lo) > max(self.below, floor):
            self.reason = (f"{AHEAD} after {of}: its interval so far starts at "
                           f"{math.exp(lo):.3f}x, above {floor:.3f}x (1 + the minimum effect) "
                           f"and {self.below:.3f}x ({self.why})")
            return True
        return False


def sample_rounds(engines: Sequence[Engine], settings: TimingSettings,
                  n_inputs: int, stop: Stop | None = None) -> list[list[list[float]]]:
    """A screening trial's timing: ``rounds`` rounds, each engine's block ``block_warmup``
    lead-in runs (or fewer, once ``block_warmup_s`` seconds have passed) then its share of
    ``samples`` (:func:`block_sizes`); ``stop`` (a :class:`Race`) may end it after a round;
    see :func:`time_rounds`."""
    return time_rounds(engines, block_sizes(settings), settings.block_warmup, n_inputs,
                       lead_in_s=settings.block_warmup_s or None, stop=stop)


def process_rounds(engines: Sequence[Engine], settings: TimingSettings, n_inputs: int, *,
                   offset: int = 0) -> list[list[list[float]]]:
    """A measuring process's timing (the confirmation): ``confirm_rounds`` rounds, each
    engine's block ``confirm_warmup`` lead-in runs then up to ``confirm_runs`` timed runs or
    ``confirm_block_s`` seconds of them (at least :data:`MIN_BLOCK_RUNS`), the engine at
    ``offset`` first in the first round; see :func:`time_rounds`."""
    return time_rounds(engines, [settings.confirm_runs] * settings.confirm_rounds,
                       settings.confirm_warmup, n_inputs, offset=offset,
                       block_s=settings.confirm_block_s)


def time_rounds(engines: Sequence[Engine], sizes: Sequence[int], lead_in: int, n_inputs: int,
                *, offset: int = 0, block_s: float | None = None,
                lead_in_s: float | None = None, stop: Stop | None = None
                ) -> list[list[list[float]]]:
    """Time every engine once per round in a block: ``lead_in`` untimed runs (with
    ``lead_in_s``: ending once that many seconds have passed since the first, and one is done),
    then ``sizes[r]`` timed runs in round ``r`` (with ``block_s``: at most that many, ending
    once ``block_s`` seconds have passed since the first and :data:`MIN_BLOCK_RUNS` are
    taken). The order rotates from round to round, from the engine at ``offset``, so that each
    engine takes each position and the last of a round goes first in the next (A B, B A, ...;
    A B C, C A B, B C A): that engine's block keeps it open, every other block opens its
    engine afresh (a backend that loads per block loads one engine fewer a round), and the
    previous engine is released before the next one opens. ``stop``, asked after each round,
    may end the rounds early. Returns samples per engine, per round."""
    out: list[list[list[float]]] = [[] for _ in engines]
    k = len(engines)
    fn: Timed | None = None
    held = -1
    for r, count in enumerate(sizes):
        for idx in [(offset - r + j) % k for j in range(k)]:  # each engine takes each position
            if idx != held:
                fn = None  # released before the next engine opens
                fn, held = engines[idx](), idx
            assert fn is not None
            start = time.perf_counter()
            for i in range(lead_in):
                fn(i % n_inputs)
                if lead_in_s is not None and time.perf_counter() - start >= lead_in_s:
                    break
            out[idx].append(_block(fn, count, n_inputs, block_s))
        if stop is not None and stop(out):
            break
    return out


def _block(fn: Timed, count: int, n_inputs: int, block_s: float | None) -> list[float]:
    """One block's timed runs (see :func:`time_rounds`)."""
    if block_s is None:
        return [fn(i % n_inputs) for i in range(count)]
    samples: list[float] = []
    start = time.perf_counter()
    while len(samples) < count and (
            len(samples) < MIN_BLOCK_RUNS or time.perf_counter() - start < block_s):
        samples.append(fn(len(samples) % n_inputs))
    return samples


def flatten(rounds: Sequence[Sequence[float]]) -> tuple[list[float], list[int]]:
    """Samples of every round in order, and the round index of each."""
    return ([x for block in rounds for x in block],
            [r for r, block in enumerate(rounds) for _ in block])


def unflatten(samples: Sequence[float], round_index: Sequence[int]) -> list[list[float]]:
    """Inverse of :func:`flatten`; ValueError when the two lists do not fit together."""
    if len(samples) != len(round_index) or any(r < 0 for r in round_index):
        raise ValueError("samples and round indices do not match")
    out: list[list[float]] = [[] for _ in range(max(round_index, default=-1) + 1)]
    for x, r in zip(samples, round_index):
        out[r].append(x)
    return out


def median_ci(samples: Sequence[float] | np.ndarray, confidence: float) -> tuple[float, float]:
    """Distribution-free confidence interval of the median from order statistics."""
    from scipy import stats  # imported here: trial processes time engines without scipy

    x = np.sort(np.asarray(samples, dtype=float))
    n = len(x)
    if n < 3:
        return float(x[0]), float(x[-1])
    lo = int(stats.binom.ppf((1 - confidence) / 2, n, 0.5))
    hi = int(stats.binom.isf((1 - confidence) / 2, n, 0.5))
    lo = max(lo - 1, 0)
    hi = min(hi, n - 1)
    return float(x[lo]), float(x[hi])


def summarize(samples: Sequence[float], confidence: float, warmup_runs: int = 0) -> TimingSummary:
    """Median with its interval, mean and percentiles of ``samples`` (ms)."""
    x = np.asarray(samples, dtype=float)
    lo, hi = median_ci(x, confidence)
    return TimingSummary(n=len(x), median_ms=float(np.median(x)), ci_low_ms=lo, ci_high_ms=hi,
                         mean_ms=float(np.mean(x)), p10_ms=float(np.percentile(x, 10)),
                         p90_ms=float(np.percentile(x, 90)), warmup_runs=warmup_runs,
                         p99_ms=float(np.percentile(x, 99)))


def block_stat(block: Sequence[float], estimator: Estimator = "median") -> float:
    """A block's statistic: its median, or its 10th percentile (:data:`Estimator`)."""
    if estimator == "median":
        return float(np.median(block))
    return float(np.percentile(block, BLOCK_QUANTILE[estimator]))


def round_ratios(baseline: Sequence[Sequence[float]],
                 candidate: Sequence[Sequence[float]],
                 estimator: Estimator = "median") -> np.ndarray:
    """One paired statistic per round: the baseline's block statistic / the candidate's (the
    block median, or with ``estimator`` ``p10`` the block's 10th percentile)."""
    if len(baseline) != len(candidate):
        raise ValueError("baseline and candidate have different numbers of rounds")
    return np.array([block_stat(b, estimator) / block_stat(c, estimator)
                     for b, c in zip(baseline, candidate) if len(b) and len(c)])


def _signed_rank_cdf(n: int) -> np.ndarray:
    """P(T+ <= t) for t = 0..n(n+1)/2 under the null (exact, no ties)."""
    counts = np.zeros(n * (n + 1) // 2 + 1)
    counts[0] = 1.0
    for k in range(1, n + 1):  # subsets of {1..n}: add rank k or not
        counts[k:] = counts[k:] + counts[:-k].copy()
    return np.cumsum(counts) / 2.0 ** n


def shift_interval(x: Sequence[float] | np.ndarray, confidence: float) -> tuple[float, float, float]:
    """Hodges-Lehmann estimate of the centre of ``x`` and its exact distribution-free interval
    (the one that goes with the signed-rank test: order statistics of the Walsh averages).
    With too few values for the level, the interval is the widest there is (min to max)."""
    v = np.sort(np.asarray(x, dtype=float))
    n = len(v)
    i, j = np.triu_indices(n)
    walsh = np.sort((v[i] + v[j]) / 2)
    est = float(np.median(walsh))
    c = int(np.sum(_signed_rank_cdf(n) <= (1 - confidence) / 2))  # P(T+ <= c-1) <= tail
    if c == 0:
        return est, float(walsh[0]), float(walsh[-1])
    return est, float(walsh[c - 1]), float(walsh[len(walsh) - c])


def signed_rank_p(x: Sequence[float]) -> float:
    """Two-sided Wilcoxon signed-rank p-value of ``x`` against 0 (exact where scipy can)."""
    from scipy import stats  # imported here: trial processes time engines without scipy

    v = np.asarray(x, dtype=float)
    if len(v) == 0 or np.all(v == 0):
        return 1.0
    return float(stats.wilcoxon(v, alternative="two-sided").pvalue)


def process_log(baseline: Sequence[Sequence[float]], other: Sequence[Sequence[float]],
                confidence: float, estimator: Estimator = "median") -> float:
    """One measuring process's observation: the log speedup of ``other`` over ``baseline``
    (samples per round of each, timed in that process), the Hodges-Lehmann estimate of its log
    round ratios (of block medians, or of the ``estimator``'s statistic)."""
    return shift_interval(np.log(round_ratios(baseline, other, estimator)), confidence)[0]


@dataclass(frozen=True)
class ProcessStats:
    """Student's t over per-process log speedups."""

    n: int
    mean: float
    low: float
    """Lower end of the mean's interval at the settings' confidence (log scale)."""
    high: float
    predict_low: float
    """Lower end of the prediction interval for one new process's reading (log scale)."""
    predict_high: float
    p_value: float


def process_stats(logs: Sequence[float], confidence: float, *,
                  bound: float | None = None) -> ProcessStats:
    """Mean, interval and prediction interval of per-process log speedups, and the p-value:
    with ``bound`` (log scale) one-sided, of "the mean is at most ``bound``" (a candidate: is
    it faster than the minimum effect?); without it, two-sided against 0 (the A/A: do two
    loads of one engine differ?)."""
    from scipy import stats  # imported here: trial processes time engines without scipy

    v = np.asarray(logs, dtype=float)
    n = len(v)
    if n < 2:
        raise ValueError("a test over processes needs at least two processes")
    m, sd = float(v.mean()), float(v.std(ddof=1))
    q = float(stats.t.ppf(0.5 + confidence / 2, n - 1))
    se = sd / math.sqrt(n)
    if se == 0.0:  # identical readings: the test degenerates to the sign of the difference
        p = ((0.0 if m > bound else 1.0) if bound is not None else (1.0 if m == 0 else 0.0))
    elif bound is not None:
        p = float(stats.t.sf((m - bound) / se, n - 1))
    else:
        p = float(2 * stats.t.sf(abs(m) / se, n - 1))
    half, pred = q * se, q * sd * math.sqrt(1 + 1 / n)
    return ProcessStats(n=n, mean=m, low=m - half, high=m + half, predict_low=m - pred,
                        predict_high=m + pred, p_value=p)


def process_compare(logs: Sequence[float], baseline_samples: Sequence[float],
                    settings: TimingSettings, *, level: float, aa: bool,
                    round_ratios_: Sequence[float] = (), baseline_warmup: int = 0,
                    estimator: Estimator = "median") -> Comparison:
    """The confirmation's reading over measuring processes (one log speedup each). A candidate
    (``aa`` false; its logs are against the A/A load in the same process) is tested one-sided
    against the minimum effect at ``level``; the A/A (its logs: first load over second load)
    two-sided against 1.0 at ``level``."""
    bound = None if aa else log_effect(settings.min_effect)
    st = process_stats(logs, settings.confidence, bound=bound)
    speedup, lo, hi = math.exp(st.mean), math.exp(st.low), math.exp(st.high)
    significant = st.p_value < level
    return Comparison(
        baseline=summarize(baseline_samples, settings.confidence, baseline_warmup),
        speedup=speedup, speedup_ci_low=lo, speedup_ci_high=hi, p_value=st.p_value,
        test=PROCESS_TEST, significant=significant,
        faster=significant and not aa and lo > 1.0,
        slower=aa and significant and reaches_effect(1 / speedup, settings.min_effect)
        and hi < 1.0,
        rounds=len(round_ratios_) or None, round_ratios=[float(r) for r in round_ratios_] or None,
        procedure="independent", level=level, against="baseline" if aa else "aa",
        processes=st.n, process_speedups=[math.exp(x) for x in logs],
        prediction_low=math.exp(st.predict_low), prediction_high=math.exp(st.predict_high),
        estimator=estimator)


def compare(baseline: Sequence[Sequence[float]], candidate: Sequence[Sequence[float]],
            settings: TimingSettings, *, alpha: float | None = None,
            baseline_warmup: int = 0, estimator: Estimator = "median") -> Comparison:
    """Compare a candidate with the baseline timed alongside it in one process, round by round
    (samples per round of each; the same number of rounds): the screening's reading, of block
    medians or of the ``estimator``'s statistic."""
    alpha = settings.alpha if alpha is None else alpha
    ratios = round_ratios(baseline, candidate, estimator)
    logs = np.log(ratios)
    est, lo, hi = shift_interval(logs, settings.confidence)
    p = signed_rank_p(logs)
    speedup = float(np.exp(est))
    significant = p < alpha
    return Comparison(
        baseline=summarize(flatten(baseline)[0], settings.confidence, baseline_warmup), speedup=speedup,
        speedup_ci_low=float(np.exp(lo)), speedup_ci_high=float(np.exp(hi)), p_value=p,
        test=TEST_NAME, significant=significant,
        faster=significant and reaches_effect(speedup, settings.min_effect)
        and float(np.exp(lo)) > 1.0,
        slower=significant and reaches_effect(1 / speedup, settings.min_effect)
        and float(np.exp(hi)) < 1.0,
        rounds=len(ratios), round_ratios=[float(r) for r in ratios], procedure="screening",
        level=alpha, estimator=estimator)
