"""Timing statistics: intervals that cover, comparisons that decide, interleaving."""

from __future__ import annotations

import numpy as np

from dossier.timing import TimingSettings, compare, median_ci, sample_interleaved, summarize

SETTINGS = TimingSettings(bootstrap_resamples=500)


def test_median_interval_covers_the_true_median_about_95_percent() -> None:
    rng = np.random.default_rng(7)
    true_median = np.log(2)  # exponential(1)
    hits = sum(lo <= true_median <= hi for lo, hi in
               (median_ci(rng.exponential(1.0, 60), 0.95) for _ in range(600)))
    assert 0.92 <= hits / 600 <= 0.99


def test_summary_fields() -> None:
    s = summarize([1.0, 2.0, 3.0, 4.0, 100.0], 0.95, warmup_runs=3)
    assert s.median_ms == 3.0 and s.n == 5 and s.warmup_runs == 3
    assert s.ci_low_ms <= 3.0 <= s.ci_high_ms and s.mean_ms == 22.0


def test_real_gain_is_faster_and_same_distribution_is_not() -> None:
    rng = np.random.default_rng(3)
    base = rng.lognormal(np.log(2.0), 0.05, 80)
    fast = rng.lognormal(np.log(1.6), 0.05, 80)
    c = compare(base, fast, SETTINGS)
    assert c.faster and not c.slower and c.speedup_ci_low > 1.1
    same = compare(base, rng.lognormal(np.log(2.0), 0.05, 80), SETTINGS)
    assert not same.faster and same.speedup_ci_low < 1.0 < same.speedup_ci_high
    slow = compare(fast, base, SETTINGS)
    assert slow.slower and not slow.faster


def test_tiny_significant_gain_below_min_effect_is_not_a_gain() -> None:
    rng = np.random.default_rng(5)
    base = rng.normal(2.0, 0.002, 200)
    cand = rng.normal(1.99, 0.002, 200)  # 0.5% faster, very significant
    c = compare(base, cand, SETTINGS)
    assert c.significant and not c.faster


def test_interleaving_alternates_order_and_counts() -> None:
    calls: list[str] = []

    def make(tag: str):
        return lambda i: calls.append(tag) or 1.0

    settings = TimingSettings(samples=6, rounds=3, block_warmup=1)
    out = sample_interleaved([make("a"), make("b")], settings, 1)
    assert [len(x) for x in out] == [6, 6]
    # A B, B A, A B (each block one untimed run first): neither always goes first
    assert "".join(calls) == "aaabbbbbbaaaaaabbb"
