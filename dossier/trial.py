"""Trials: one route built, validated and timed, and the record it leaves.

A trial's outcome is data, never an exception: ``ok``, ``rejected`` (accuracy), ``build_failed``,
``crashed`` (the child died: a signal, no result), ``timeout`` or ``runtime_error``.
"""

from __future__ import annotations

import enum
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from dossier.load_config import LoadConfig
from dossier.measure.conditions import Conditions
from dossier.measure.figure import speedup_text


class Outcome(str, enum.Enum):
    """How a trial ended."""

    OK = "ok"
    """Built, ran, passed the accuracy check, timed."""
    REJECTED = "rejected"
    """Ran, but a loss reached the threshold or an output held NaN/Inf."""
    BUILD_FAILED = "build_failed"
    """The compiler refused or failed to build the route."""
    CRASHED = "crashed"
    """The trial's process died (a signal, or it exited without a result)."""
    TIMEOUT = "timeout"
    """The trial ran past its wall-clock limit and was killed."""
    RUNTIME_ERROR = "runtime_error"
    """The engine built but failed to load or to run."""


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


class TrialRecord(_Model):
    """One line of the tuning cache per finished trial."""

    kind: Literal["trial"] = "trial"
    """Record type tag."""
    index: int
    """Position of the trial in the search (0 is the baseline)."""
    route: str
    """Canonical route text."""
    role: Literal["baseline", "search", "confirm"] = "search"
    """Why the trial ran."""
    outcome: Outcome
    """How it ended."""
    reason: str | None = None
    """Why it did not end ``ok``: the error, the signal, or the loss that failed."""
    losses: dict[str, dict[str, float | None]] | None = None
    """Per validation pair, per output tensor: the loss (None where the output held NaN/Inf)."""
    worst_loss: float | None = None
    """The largest loss over all pairs and outputs."""
    timing: TimingSummary | None = None
    """The candidate's latency."""
    comparison: Comparison | None = None
    """The candidate against the baseline timed alongside it (the A/A check for the baseline)."""
    samples_ms: list[float] | None = None
    """The candidate's raw timed samples, in the order taken."""
    baseline_samples_ms: list[float] | None = None
    """The baseline's raw samples taken interleaved with the candidate's."""
    sample_rounds: list[int] | None = None
    """Round index of each of ``samples_ms``."""
    baseline_sample_rounds: list[int] | None = None
    """Round index of each of ``baseline_samples_ms``."""
    raced: str | None = Field(None, max_length=400)
    """Why the screening timed this trial fewer rounds than ``rounds`` (racing, ``race_rounds``):
    its interval lay wholly below the bar, or the accuracy filter had rejected it; None: it
    timed every round."""
    build_s: float | None = None
    """Compile time of the engine (kept apart from inference latency)."""
    trial_s: float
    """Wall time of the whole trial, child process start to result."""
    phases_s: dict[str, float] = Field(default_factory=dict)
    """Wall time of each phase of the trial: startup (process start and imports), build, load,
    validate, time; the rest of trial_s is orchestration (request, result, record)."""
    engine: str | None = None
    """Engine file, relative to the run folder, kept for admissible routes."""
    engine_digest: str | None = None
    """xxh3-128 of the engine file."""
    started_at: str
    """UTC start time, ISO 8601."""
    extra: dict[str, str] = Field(default_factory=dict)
    """Backend facts about the built engine (e.g. plan header fields)."""
    load: LoadConfig | None = None
    """How production should load the kept engine: the backend's production load configuration
    for this route, taken from the backend the search ran (its builder options included) when
    the trial was recorded. None when no engine was kept, and in records written before it was
    recorded (bundling such a run asks the backend installed then)."""
    engine_flags: dict[str, bool] | None = None
    """Boolean facts about the kept engine that the verify policy uses (e.g. TensorRT's
    ``version_compatible``), recorded like ``load``; None when no engine was kept, and in
    records written before they were recorded."""
    conditions: list[Conditions] | None = None
    """What the host was doing while the trial ran (:mod:`dossier.measure.conditions`): one entry for
    a search trial, one per measuring process for a confirmation record; None in records
    written before they were recorded."""

    @property
    def admissible(self) -> bool:
        """Built, ran and passed the accuracy check."""
        return self.outcome is Outcome.OK

    @property
    def faster(self) -> bool:
        """Admissible and significantly faster than the baseline."""
        return self.admissible and self.comparison is not None and self.comparison.faster

    def reading(self, alpha: float, min_effect: float = 0.0) -> Reading | None:
        """Its comparison as a :class:`Reading` judged like a candidate: significant when p is
        below ``alpha`` and the speedup at least ``min_effect`` away from 1.0 in either
        direction (None when untimed)."""
        c = self.comparison
        if c is None:
            return None
        return Reading(trial_index=self.index, procedure=c.procedure or "screening",
                       speedup=c.speedup, speedup_ci_low=c.speedup_ci_low,
                       speedup_ci_high=c.speedup_ci_high, p_value=c.p_value, rounds=c.rounds,
                       processes=c.processes,
                       significant=c.p_value < alpha and not (
                           1 / (1 + min_effect) < c.speedup < 1 + min_effect))
