"""A speed reading, at the bottom of the measurement: one engine's timing summary
(:class:`TimingSummary`), a candidate against the baseline timed alongside it
(:class:`Comparison`) and that comparison in a line (:class:`Reading`). Pure data: the
statistics that fill them are :mod:`dossier.measure.timing`'s."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict

from dossier.measure.figure import speedup_text

AHEAD = "ahead"
"""How the ``raced`` of a screening trial that stopped *above* its bar begins
(:class:`dossier.measure.timing.Race`); every other ``raced`` says why it stopped below it."""


def stopped_ahead(raced: str | None) -> bool:
    """Whether a trial's ``raced`` says it stopped ahead (above its bar), not raced out."""
    return raced is not None and raced.startswith(AHEAD)


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
    ``faster`` and ``slower`` follow from ``p_value`` and this level. None in older records."""
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

    def judged_at(self, alpha: float) -> float:
        """The level this reading is judged at: the one it records, else ``alpha`` (older
        records, which kept none: the caller says what they were judged at)."""
        return self.level if self.level is not None else alpha

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

    def text(self) -> str:
        """``1.004x [0.990, 1.012] (p=0.6, 16 rounds)`` or ``(p=0.6, 5 processes)``."""
        n = (f", {self.processes} processes" if self.processes
             else f", {self.rounds} rounds" if self.rounds else "")
        return (f"{speedup_text(self.speedup, self.speedup_ci_low, self.speedup_ci_high)} "
                f"(p={self.p_value:.2g}{n})")
