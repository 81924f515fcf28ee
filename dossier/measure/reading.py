"""A speed reading that judges itself, at the bottom of the measurement.

One engine's timing summary (:class:`TimingSummary`), a candidate against the baseline timed
alongside it (:class:`Comparison`: its figures, the level it is judged at, its verdict against
the minimum effect and its text) and that comparison in a line (:class:`Reading`). Every place
that calls a route faster or slower, or a gain large enough, asks this module
(:meth:`Comparison.verdict`, :func:`reaches_effect`, :func:`log_effect`); nothing else compares
a speedup against ``1 + min_effect``. The level is the one the reading records; records written
before it was kept get theirs once, when the tuning cache is read
(:func:`dossier.cache.resolve_levels`), so no caller supplies one. The statistics that fill
these models are :mod:`dossier.measure.timing`'s.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

from pydantic import BaseModel, ConfigDict

from dossier.measure.figure import speedup_text

AHEAD = "ahead"
"""How the ``raced`` of a screening trial that stopped *above* its bar begins
(:class:`dossier.measure.timing.Race`); every other ``raced`` says why it stopped below it."""


def stopped_ahead(raced: str | None) -> bool:
    """Whether a trial's ``raced`` says it stopped ahead (above its bar), not raced out."""
    return raced is not None and raced.startswith(AHEAD)


SAMPLES_TEST = "mann-whitney-u"
"""``Comparison.test`` of records before rounds: Mann-Whitney U over samples."""
ROUNDS_TEST = "wilcoxon-signed-rank-rounds"
"""``Comparison.test`` of a round-level comparison (screening)."""
PROCESS_TEST = "t-test-processes"
"""``Comparison.test`` of the confirmation: Student's t over per-process log speedups; for a
candidate one-sided against the minimum effect, for the A/A two-sided against 1.0."""


def test_name(test: str) -> str:
    """A significance test's name in words."""
    return {SAMPLES_TEST: "two-sided Mann-Whitney U",
            ROUNDS_TEST: "two-sided Wilcoxon signed-rank over rounds",
            PROCESS_TEST: "Student's t over measuring processes (a candidate: one-sided, "
                          "against the minimum effect)"}.get(test, test)


def effect_floor(min_effect: float, over: float = 1.0) -> float:
    """The speedup the minimum effect asks above ``over`` (the baseline's 1.0x, or the best
    speedup so far): ``over x (1 + min_effect)``."""
    return over * (1 + min_effect)


def reaches_effect(speedup: float, min_effect: float, over: float = 1.0) -> bool:
    """Whether ``speedup`` is at least the minimum effect above ``over`` (the baseline's 1.0x,
    or the best speedup so far): ``speedup >= over x (1 + min_effect)``."""
    return speedup >= effect_floor(min_effect, over)


def within_effect(speedup: float, min_effect: float) -> bool:
    """Whether ``speedup`` is less than the minimum effect away from 1.0, either way."""
    return 1 / (1 + min_effect) < speedup < 1 + min_effect


def log_effect(min_effect: float) -> float:
    """The minimum effect on the log scale the tests over log speedups work on:
    log(1 + min_effect)."""
    return math.log1p(min_effect)


Label = Literal["faster", "slower", "no significant effect"]


@dataclass(frozen=True)
class SpeedVerdict:
    """What a comparison shows, in a word and in a clause."""

    label: Label
    reasons: tuple[str, ...]
    """Why not faster or slower (empty for faster and slower)."""
    figures: str
    """``0.759x [0.657, 1.157], p=3.2e-05``: the figures the verdict follows from."""

    @property
    def text(self) -> str:
        """``slower (0.759x [0.700, 0.800], p=1e-05)`` or ``no significant effect: its
        interval [0.657, 1.157] includes 1.0``."""
        if self.reasons:
            return f"{self.label}: {', '.join(self.reasons)}"
        return f"{self.label} ({self.figures})"


class _Model(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class TimingSummary(_Model):
    """Statistics of one engine's latency samples."""

    n: int
    """Number of timed samples."""
    median_ms: float
    """Median latency."""
    ci_low_ms: float
    """Lower end of the median's confidence interval (order statistics, distribution-free)."""
    ci_high_ms: float
    """Upper end of the median's confidence interval."""
    mean_ms: float
    """Arithmetic mean (for comparison with tools that rank on the mean)."""
    p10_ms: float
    """10th percentile."""
    p90_ms: float
    """90th percentile."""
    warmup_runs: int
    """Runs discarded as warm-up before sampling began."""
    p99_ms: float | None = None
    """99th percentile (None in records written before it was kept)."""


class Comparison(_Model):
    """A candidate against the baseline timed alongside it, round by round."""

    baseline: TimingSummary
    """The baseline's samples taken alongside this candidate."""
    speedup: float
    """Baseline / candidate latency (> 1 means the candidate is faster): the Hodges-Lehmann
    estimate over rounds of the ratio of block medians (older records: ratio of medians)."""
    speedup_ci_low: float
    """Lower end of the speedup's confidence interval (exact signed-rank interval over rounds;
    older records: bootstrap over samples)."""
    speedup_ci_high: float
    """Upper end of the speedup's confidence interval."""
    p_value: float
    """Two-sided p-value of ``test``."""
    test: str = "mann-whitney-u"
    """The significance test used: ``wilcoxon-signed-rank-rounds`` (the signed-rank test on
    the log round ratios) or, in records before rounds, ``mann-whitney-u`` over samples."""
    significant: bool
    """p_value below alpha."""
    faster: bool
    """Significant, the speedup at least 1 + the minimum effect, and its interval above 1.0."""
    slower: bool
    """Significant, the speedup at most 1 / (1 + the minimum effect), and its interval below
    1.0."""
    rounds: int | None = None
    """Rounds the statistics were computed over (the unit of replication)."""
    round_ratios: list[float] | None = None
    """Per round: the baseline's block statistic / the candidate's (``estimator``: the block
    median, or its 10th percentile)."""
    procedure: str | None = None
    """``screening`` (one process, engines alternating in blocks) or ``independent`` (the
    confirmation: measuring processes of their own, :mod:`dossier.measure.confirmation`)."""
    generation_speedups: list[float] | None = None
    """Older records only (a confirmation in process generations, one process per engine):
    each generation's own speedup."""
    generation_interval: Literal["prediction", "mean"] | None = None
    """Older records only: with ``generation_speedups``, what the interval also covered."""

    level: float | None = None
    """The significance level this reading was judged at (alpha for screening; alpha / (m x L)
    for a confirmation candidate, Bonferroni over L looks and Holm's step-down over the m
    candidates not confirmed yet). ``significant``,
    ``faster`` and ``slower`` follow from ``p_value`` and this level. None in older records
    (reading the tuning cache gives them theirs, :func:`dossier.cache.resolve_levels`)."""
    against: Literal["baseline", "aa"] | None = None
    """What the speedup is over: the baseline load, or (a confirmation candidate) the A/A's
    second load of the baseline in the same processes, so the test is of the candidate's
    difference from the A/A. None in older records (the baseline)."""
    processes: int | None = None
    """Measuring processes the confirmation's statistics are over (its unit of replication)."""
    process_speedups: list[float] | None = None
    """Per measuring process: its speedup (the Hodges-Lehmann estimate over its rounds)."""
    prediction_low: float | None = None
    """Lower end of the prediction interval for one new process's reading (what a
    re-measurement, ``verify --rebench``, is expected to read)."""
    prediction_high: float | None = None
    """Upper end of that prediction interval."""
    estimator: Literal["median", "p10"] | None = None
    """The block statistic the per-round ratios were taken of: ``median`` (each block's
    median), or ``p10`` (each block's 10th percentile: the estimate that added delay cannot
    inflate, used when a measurement of this reading was busier than the target declares,
    :mod:`dossier.measure.target`). None in older records (the median)."""

    def text(self) -> str:
        """``1.234x [1.100, 1.380]``."""
        return speedup_text(self.speedup, self.speedup_ci_low, self.speedup_ci_high)

    @property
    def judged_level(self) -> float:
        """The level this reading is judged at: the one it records. A record written before
        the level was kept has it from the reader (:func:`dossier.cache.resolve_levels`);
        a comparison without one was never read that way, which is a bug."""
        if self.level is None:
            raise ValueError("a speed reading without the level it is judged at: older records "
                             "get theirs when the tuning cache is read (resolve_levels)")
        return self.level

    @property
    def clears_level(self) -> bool:
        """Its p-value is below the level it is judged at."""
        return self.p_value < self.judged_level

    @property
    def includes_one(self) -> bool:
        """Its interval includes 1.0 (no difference)."""
        return self.speedup_ci_low <= 1.0 <= self.speedup_ci_high

    def reaches(self, min_effect: float) -> bool:
        """Its speedup is at least 1 + the minimum effect."""
        return reaches_effect(self.speedup, min_effect)

    def verdict(self, min_effect: float) -> SpeedVerdict:
        """Faster, slower or no significant effect, at the level this reading records: the one
        judge of every place that calls a route faster, slower or neither, so a verdict never
        contradicts the speedup and interval printed beside it.

        A confirmation candidate's test (``t-test-processes`` against the A/A) is one-sided
        against the minimum effect, so its p already says whether the gain reaches it: faster
        when p is below the level and the interval excludes 1.0. Every other reading (screening
        rounds, an A/A) is two-sided against 1.0: faster or slower when p is below the level,
        the interval excludes 1.0 on that side and the speedup is at least the minimum effect
        away from 1.0."""
        level = self.judged_level
        lo, hi, x = self.speedup_ci_low, self.speedup_ci_high, self.speedup
        figures = f"{self.text()}, p={self.p_value:.2g}"
        significant = self.p_value < level
        if self.test == PROCESS_TEST and self.against == "aa":
            if significant and lo > 1.0:
                return SpeedVerdict("faster", (), figures)
            reasons = []
            if not reaches_effect(hi, min_effect):
                reasons.append(f"its interval [{lo:.3f}, {hi:.3f}] "
                               f"lies below the minimum effect of {min_effect:.0%}")
            elif self.includes_one:
                reasons.append(f"its interval [{lo:.3f}, {hi:.3f}] includes 1.0")
            if not significant:
                reasons.append(f"p={self.p_value:.2g} (against a gain of {min_effect:.0%}) is "
                               f"not below {level:.2g}")
            return SpeedVerdict("no significant effect", tuple(reasons) or ("not confirmed",),
                                figures)
        if not self.includes_one and significant:
            if reaches_effect(x, min_effect) and lo > 1.0:
                return SpeedVerdict("faster", (), figures)
            if x <= 1 / (1 + min_effect) and hi < 1.0:
                return SpeedVerdict("slower", (), figures)
        reasons = []
        if self.includes_one:
            reasons.append(f"its interval [{lo:.3f}, {hi:.3f}] includes 1.0")
        if not significant:
            reasons.append(f"p={self.p_value:.2g} is not below {level:.2g}")
        if 1 <= x and within_effect(x, min_effect):
            reasons.append(f"{x:.3f}x is below the minimum effect of {min_effect:.0%}")
        elif x < 1 and within_effect(x, min_effect):
            reasons.append(f"{x:.3f}x is a slowdown smaller than the minimum effect of "
                           f"{min_effect:.0%}")
        if not reasons:  # significant and large, but the interval lies on the other side of 1.0
            reasons.append(f"its interval [{lo:.3f}, {hi:.3f}] does "
                           f"not support the median's {x:.3f}x")
        return SpeedVerdict("no significant effect", tuple(reasons), figures)

    def reading(self, trial_index: int, min_effect: float = 0.0) -> Reading:
        """This comparison as a :class:`Reading` of trial ``trial_index``, judged like a
        candidate: significant when p is below its level and the speedup at least
        ``min_effect`` away from 1.0 in either direction."""
        return Reading(trial_index=trial_index, procedure=self.procedure or "screening",
                       speedup=self.speedup, speedup_ci_low=self.speedup_ci_low,
                       speedup_ci_high=self.speedup_ci_high, p_value=self.p_value,
                       rounds=self.rounds, processes=self.processes,
                       significant=self.clears_level
                       and not within_effect(self.speedup, min_effect))

    def round_range(self) -> tuple[float, float] | None:
        """The smallest and largest per-round ratio (None in records without them)."""
        return (min(self.round_ratios), max(self.round_ratios)) if self.round_ratios else None


class Reading(_Model):
    """One speedup measurement in a line: what an A/A check or a confirmation read."""

    trial_index: int
    """The trial record it comes from."""
    procedure: str
    """``screening`` (in-process rounds) or ``independent`` (a fresh process per engine)."""
    speedup: float
    """Baseline / candidate latency (for an A/A: first load / second load)."""
    speedup_ci_low: float
    """Lower end of its interval."""
    speedup_ci_high: float
    """Upper end."""
    p_value: float
    """Two-sided p-value."""
    rounds: int | None
    """Rounds it was computed over."""
    processes: int | None = None
    """Measuring processes it was computed over (the confirmation's unit)."""
    significant: bool
    """A difference the rule acts on: p below the level it was judged at, and the reading at
    least the minimum effect away from 1.0 (as a candidate must be to ship)."""

    @property
    def includes_one(self) -> bool:
        """Its interval includes 1.0 (no difference)."""
        return self.speedup_ci_low <= 1.0 <= self.speedup_ci_high

    def text(self) -> str:
        """``1.004x [0.990, 1.012] (p=0.6, 16 rounds)`` or ``(p=0.6, 5 processes)``."""
        n = (f", {self.processes} processes" if self.processes
             else f", {self.rounds} rounds" if self.rounds else "")
        return (f"{speedup_text(self.speedup, self.speedup_ci_low, self.speedup_ci_high)} "
                f"(p={self.p_value:.2g}{n})")
