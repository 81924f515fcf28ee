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

An independent measurement in several **process generations** (``confirm_processes``) also has
a unit above the round: rounds timed by the same processes share those processes' state, and on
the H200 that state moved a speedup between 2.7x and 4.2x from one process to the next. Its
interval is then the wider of the round-level interval and a prediction interval for the
estimate of a new generation (Student's t over the generations' estimates, on the log scale):
what a re-measurement in fresh processes can be expected to read.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from dossier.trial import Comparison, TimingSummary

Timed = Callable[[int], float]
"""A function that runs the engine on input set ``i`` and returns the latency in ms."""

Engine = Callable[[], Timed]
"""Called at the start of every block: the function to time in that block."""

TEST_NAME = "wilcoxon-signed-rank-rounds"
"""``Comparison.test`` of a round-level comparison."""


class TimingSettings(BaseModel):
    """How trials are timed and compared. The same settings apply to baseline and candidates."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    samples: int = Field(320, ge=5)
    """Timed runs per engine per trial, split evenly into one block per round."""
    rounds: int = Field(16, ge=2)
    """Rounds of a screening trial: the unit of replication. Engines alternate order from
    round to round. The smallest two-sided p of the signed-rank test is 2 / 2**rounds, so
    ``dossier tune`` refuses rounds that cannot reach alpha."""
    block_warmup: int = Field(5, ge=0)
    """Untimed lead-in runs at the start of every block, so the engine that ran just before
    (its threads, its data in the caches) does not colour the block."""
    warmup_min_runs: int = Field(5, ge=1)
    """Warm-up runs at least."""
    warmup_window: int = Field(10, ge=2)
    """Warm-up is over when the medians of two successive windows of this many runs agree."""
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
    bootstrap_resamples: int = Field(2000, ge=100)
    """Unused since intervals are computed over rounds (exact); kept so older tuning caches
    still read."""
    trial_timeout_s: float = Field(600.0, gt=0)
    """Wall-clock limit of one trial (build, validation and timing) in its own process."""
    trial_memory_limit_mb: int | None = Field(None, ge=64)
    """Address-space limit of a trial's process (None: no limit); exceeding it is recorded."""
    confirm_top: int = Field(3, ge=0)
    """How many of the best screened candidates the independent confirmation re-measures."""
    confirm_rounds: int = Field(12, ge=2)
    """Rounds of the independent confirmation (:mod:`dossier.replicate`)."""
    confirm_warmup: int = Field(30, ge=0)
    """Untimed lead-in runs before every confirmation block."""
    confirm_runs: int = Field(150, ge=5)
    """Timed runs per engine per confirmation block (at most; see confirm_block_s)."""
    confirm_block_s: float = Field(0.5, gt=0)
    """A confirmation block stops after this many seconds of timed runs (with at least 10)."""
    confirm_processes: int = Field(1, ge=1)
    """Process generations of the confirmation (and of ``verify --rebench``): its rounds are
    split into this many consecutive spans, each timed by new processes, one per engine. A
    host state that lasts a process's life (on the H200 the launch-bound baseline stayed at one
    of two speeds for a whole process) is then sampled this many times instead of once, and
    with 2 or more the interval also spans the spread between generations (a prediction
    interval for a new generation). Each generation costs every engine a process start, a load
    and a warm-up. At most ``confirm_rounds``; 3 or more on a GPU."""

    def smallest_p(self, rounds: int) -> float:
        """The smallest two-sided p-value an exact signed-rank test over ``rounds`` can give."""
        return 2.0 / float(2 ** rounds)

    def problems(self) -> list[str]:
        """What makes these settings unable to ship a gain (empty when nothing does)."""
        out = []
        if self.smallest_p(self.rounds) >= self.alpha:
            out.append(f"timing.rounds={self.rounds} cannot reach p < alpha={self.alpha:g} "
                       f"(smallest p {self.smallest_p(self.rounds):.2g})")
        k = max(self.confirm_top, 1)
        if self.confirm_top and self.smallest_p(self.confirm_rounds) >= self.alpha / k:
            out.append(f"timing.confirm_rounds={self.confirm_rounds} cannot reach p < alpha/k="
                       f"{self.alpha / k:.2g} (smallest p "
                       f"{self.smallest_p(self.confirm_rounds):.2g})")
        if self.confirm_processes > self.confirm_rounds:
            out.append(f"timing.confirm_processes={self.confirm_processes} is more than "
                       f"timing.confirm_rounds={self.confirm_rounds} (each process generation "
                       "times at least one round)")
        return out


def warm_up(fn: Timed, settings: TimingSettings, n_inputs: int) -> int:
    """Run ``fn`` until two successive windows have medians within the tolerance; return runs."""
    start = time.perf_counter()
    times: list[float] = []
    w = settings.warmup_window
    while True:
        times.append(fn(len(times) % n_inputs))
        if len(times) >= max(settings.warmup_min_runs, 2 * w):
            a = float(np.median(times[-2 * w:-w]))
            b = float(np.median(times[-w:]))
            if abs(a - b) <= settings.warmup_tolerance * max(a, b, 1e-9):
                return len(times)
        if time.perf_counter() - start > settings.warmup_max_s and len(times) >= settings.warmup_min_runs:
            return len(times)


def block_sizes(settings: TimingSettings) -> list[int]:
    """Timed runs per block, one block per round (``samples`` split as evenly as possible)."""
    n, r = settings.samples, settings.rounds
    return [max(n // r + (1 if i < n % r else 0), 1) for i in range(r)]


def sample_rounds(engines: Sequence[Engine], settings: TimingSettings,
                  n_inputs: int) -> list[list[list[float]]]:
    """Time every engine once per round in a block of lead-in then timed runs, rotating which
    engine goes first (A B, B A, ... for two). Returns samples per engine, per round."""
    out: list[list[list[float]]] = [[] for _ in engines]
    k = len(engines)
    for r, count in enumerate(block_sizes(settings)):
        for idx in [(r + j) % k for j in range(k)]:  # each engine takes each position in turn
            fn = engines[idx]()
            for i in range(settings.block_warmup):
                fn(i % n_inputs)
            out[idx].append([fn(i % n_inputs) for i in range(count)])
            del fn  # released before the next engine's block starts
    return out


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
                         p90_ms=float(np.percentile(x, 90)), warmup_runs=warmup_runs)


def round_ratios(baseline: Sequence[Sequence[float]],
                 candidate: Sequence[Sequence[float]]) -> np.ndarray:
    """One paired statistic per round: the baseline's block median / the candidate's."""
    if len(baseline) != len(candidate):
        raise ValueError("baseline and candidate have different numbers of rounds")
    return np.array([float(np.median(b)) / float(np.median(c))
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


def generations(rounds: int, processes: int) -> list[range]:
    """The rounds each process generation times: ``processes`` consecutive spans (at most
    ``rounds``), as even as can be, the longer ones first."""
    n = max(1, min(processes, rounds))
    size, extra = divmod(rounds, n)
    spans, start = [], 0
    for g in range(n):
        end = start + size + (1 if g < extra else 0)
        spans.append(range(start, end))
        start = end
    return spans


def generation_interval(logs: Sequence[float], processes: int, confidence: float,
                        prediction: bool = True) -> tuple[list[float], float, float] | None:
    """From the log round ratios of a measurement in ``processes`` generations (consecutive
    spans, :func:`generations`): the generations' own estimates (the Hodges-Lehmann estimate
    of each span) and, over the G generations, the prediction interval for a new generation's
    estimate, mean +- t(G-1) * sd * sqrt(1 + 1/G), or with ``prediction`` false the confidence
    interval for their mean, mean +- t(G-1) * sd / sqrt(G). None with fewer than two."""
    from scipy import stats  # imported here: trial processes time engines without scipy

    v = np.asarray(logs, dtype=float)
    spans = generations(len(v), processes)
    g = len(spans)
    if g < 2:
        return None
    m = np.array([shift_interval(v[span.start:span.stop], confidence)[0] for span in spans])
    scale = np.sqrt(1 + 1 / g) if prediction else np.sqrt(1 / g)
    half = float(stats.t.ppf(0.5 + confidence / 2, g - 1) * m.std(ddof=1) * scale)
    return [float(x) for x in m], float(m.mean()) - half, float(m.mean()) + half


def log_interval(logs: Sequence[float], settings: TimingSettings, procedure: str = "screening",
                 bias: bool = False) -> tuple[float, float, float, list[float] | None]:
    """The log speedup, its interval and the generations' own estimates (None unless an
    ``independent`` measurement in two or more process generations, whose interval is the
    wider of the round-level one and :func:`generation_interval`) of log round ratios.

    A candidate's generation interval is the prediction interval: a re-measurement is a new
    generation, and its reading is what the interval must cover. An A/A's (``bias``) is the
    confidence interval for the generations' mean: the A/A estimates the procedure's bias, a
    fixed property of the procedure on the host, which a gain's interval must clear."""
    est, lo, hi = shift_interval(logs, settings.confidence)
    if procedure != "independent" or settings.confirm_processes < 2:
        return est, lo, hi, None
    gens = generation_interval(logs, settings.confirm_processes, settings.confidence,
                               prediction=not bias)
    if gens is None:
        return est, lo, hi, None
    return est, min(lo, gens[1]), max(hi, gens[2]), gens[0]


def compare(baseline: Sequence[Sequence[float]], candidate: Sequence[Sequence[float]],
            settings: TimingSettings, *, alpha: float | None = None, baseline_warmup: int = 0,
            procedure: str = "screening", bias: bool = False) -> Comparison:
    """Compare a candidate with the baseline timed alongside it, round by round (samples per
    round of each; the same number of rounds). An ``independent`` measurement in two or more
    process generations (``settings.confirm_processes``) gets the wider of the round-level
    interval and the generations' prediction interval (:func:`generation_interval`); an A/A's
    (``bias``) the wider of the round-level interval and that of the generations' mean."""
    alpha = settings.alpha if alpha is None else alpha
    ratios = round_ratios(baseline, candidate)
    logs = np.log(ratios)
    est, lo, hi, gens = log_interval(logs, settings, procedure, bias)
    p = signed_rank_p(logs)
    speedup = float(np.exp(est))
    significant = p < alpha
    return Comparison(
        baseline=summarize(flatten(baseline)[0], settings.confidence, baseline_warmup), speedup=speedup,
        speedup_ci_low=float(np.exp(lo)), speedup_ci_high=float(np.exp(hi)), p_value=p,
        test=TEST_NAME, significant=significant,
        faster=significant and speedup >= 1 + settings.min_effect and float(np.exp(lo)) > 1.0,
        slower=significant and speedup <= 1 / (1 + settings.min_effect)
        and float(np.exp(hi)) < 1.0,
        rounds=len(ratios), round_ratios=[float(r) for r in ratios], procedure=procedure,
        generation_speedups=[float(np.exp(x)) for x in gens] if gens else None,
        generation_interval=("mean" if bias else "prediction") if gens else None)
