"""Timing: warm-up until stable, interleaved sampling, statistics, comparison to the baseline.

Every candidate is timed in the same process as the baseline, in alternating blocks (A B, then
B A, ...), with the same inputs rotated across the validation pairs, so neither the route's
position in the search nor a slow moment of the machine decides the comparison. Raw samples are
kept. The decision uses a Mann-Whitney U test and a minimum effect; intervals are
distribution-free (order statistics for a median, bootstrap for a ratio of medians).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from dossier.trial import Comparison, TimingSummary

Timed = Callable[[int], float]
"""A function that runs the engine on input set ``i`` and returns the latency in ms."""


class TimingSettings(BaseModel):
    """How trials are timed and compared. The same settings apply to baseline and candidates."""

    model_config = ConfigDict(frozen=True, extra="forbid", use_attribute_docstrings=True)

    samples: int = Field(60, ge=5)
    """Timed runs per engine per trial."""
    rounds: int = Field(10, ge=2)
    """Blocks the samples are split into; engines alternate order from block to block."""
    block_warmup: int = Field(2, ge=0)
    """Untimed runs at the start of every block, so the engine that ran just before (its
    threads still spinning, its data in the caches) does not colour the first samples."""
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
    """Significance level of the rank test."""
    min_effect: float = Field(0.02, ge=0)
    """A candidate must be at least this much faster (0.02 = 2%) to count as a gain."""
    bootstrap_resamples: int = Field(2000, ge=100)
    """Resamples for the speedup's bootstrap interval."""
    trial_timeout_s: float = Field(600.0, gt=0)
    """Wall-clock limit of one trial (build, validation and timing) in its own process."""
    trial_memory_limit_mb: int | None = Field(None, ge=64)
    """Address-space limit of a trial's process (None: no limit); exceeding it is recorded."""
    confirm_top: int = Field(3, ge=0)
    """How many of the best candidates are re-timed against the baseline in a fresh process."""


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


def sample_interleaved(fns: Sequence[Timed], settings: TimingSettings,
                       n_inputs: int) -> list[list[float]]:
    """Time every function ``settings.samples`` times in ``settings.rounds`` blocks, rotating
    which function goes first in each block (A B, B A, A B, ... for two); inputs cycle through
    ``n_inputs`` sets."""
    out: list[list[float]] = [[] for _ in fns]
    per_round = [settings.samples // settings.rounds + (1 if r < settings.samples % settings.rounds
                                                          else 0) for r in range(settings.rounds)]
    k = len(fns)
    for r, count in enumerate(per_round):
        order = [(r + j) % k for j in range(k)]  # each engine takes each position in turn
        for idx in order:
            fn = fns[idx]
            for i in range(settings.block_warmup):
                fn(i % n_inputs)
            out[idx].extend(fn(i % n_inputs) for i in range(count))
    return out


def median_ci(samples: Sequence[float], confidence: float) -> tuple[float, float]:
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


def _median_ratio(b: np.ndarray, c: np.ndarray, axis: int = -1) -> np.ndarray:
    return np.median(b, axis=axis) / np.median(c, axis=axis)


def compare(baseline: Sequence[float], candidate: Sequence[float], settings: TimingSettings,
            *, alpha: float | None = None, baseline_warmup: int = 0, seed: int = 0) -> Comparison:
    """Compare a candidate's samples with the baseline's taken alongside them."""
    from scipy import stats

    b = np.asarray(baseline, dtype=float)
    c = np.asarray(candidate, dtype=float)
    alpha = settings.alpha if alpha is None else alpha
    speedup = float(np.median(b) / np.median(c))
    res = stats.bootstrap((b, c), _median_ratio, vectorized=True, paired=False,
                          n_resamples=settings.bootstrap_resamples,
                          confidence_level=settings.confidence, method="percentile",
                          rng=np.random.default_rng(seed))
    lo, hi = float(res.confidence_interval.low), float(res.confidence_interval.high)
    p = float(stats.mannwhitneyu(b, c, alternative="two-sided").pvalue)
    significant = p < alpha
    return Comparison(
        baseline=summarize(b, settings.confidence, baseline_warmup), speedup=speedup,
        speedup_ci_low=lo, speedup_ci_high=hi, p_value=p, significant=significant,
        faster=significant and speedup >= 1 + settings.min_effect and lo > 1.0,
        slower=significant and speedup <= 1 / (1 + settings.min_effect) and hi < 1.0)
