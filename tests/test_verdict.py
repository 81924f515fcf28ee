"""speed_verdict: the word printed beside a speedup follows from that speedup, its interval and
its p-value, in every combination."""

from __future__ import annotations

import pytest

from dossier.measure.verdict import speed_verdict
from dossier.trial import Comparison, TimingSummary

_T = TimingSummary(n=60, median_ms=1.0, ci_low_ms=0.9, ci_high_ms=1.1, mean_ms=1.0, p10_ms=0.9,
                   p90_ms=1.1, warmup_runs=5)


def _c(speedup: float, lo: float, hi: float, p: float) -> Comparison:
    return Comparison(baseline=_T, speedup=speedup, speedup_ci_low=lo, speedup_ci_high=hi,
                      p_value=p, significant=p < 0.05, faster=False, slower=False)


@pytest.mark.parametrize(("c", "label", "says"), [
    (_c(1.10, 1.05, 1.15, 1e-6), "faster", "faster (1.100x [1.050, 1.150], p=1e-06)"),
    (_c(0.80, 0.70, 0.90, 1e-6), "slower", "slower (0.800x [0.700, 0.900], p=1e-06)"),
    # the field case: significant by the rank test, interval includes 1.0: not "slower"
    (_c(0.759, 0.657, 1.157, 3.2e-05), "no significant effect",
     "no significant effect: its interval [0.657, 1.157] includes 1.0"),
    (_c(1.10, 1.05, 1.15, 0.2), "no significant effect", "p=0.2 is not below 0.05"),
    (_c(1.01, 1.005, 1.015, 1e-6), "no significant effect",
     "1.010x is below the minimum effect of 2%"),
    (_c(0.99, 0.985, 0.995, 1e-6), "no significant effect",
     "0.990x is a slowdown smaller than the minimum effect of 2%"),
    (_c(1.10, 0.90, 0.95, 1e-6), "no significant effect", "does not support the median's"),
])
def test_verdict_follows_the_figures(c: Comparison, label: str, says: str) -> None:
    v = speed_verdict(c, alpha=0.05, min_effect=0.02)
    assert v.label == label
    assert says in v.text
    if label != "no significant effect":
        assert not v.reasons
    else:  # never a direction next to an interval that allows none
        assert "slower" not in v.text and "faster" not in v.text


def test_the_judge_reads_the_level_the_reading_records() -> None:
    """One judge: a confirmation reading carries the level it was judged at (alpha over k
    candidates and the looks), so no caller can judge it at another (explain once counted the
    A/A in Bonferroni's k and called the shipped route "no significant effect")."""
    import numpy as np

    from dossier.measure.timing import TimingSettings, process_compare
    from dossier.measure.verdict import judge

    logs = list(np.log([1.30, 1.25, 1.28, 1.35, 1.27]))
    s = TimingSettings()
    c = process_compare(logs, [1.0] * 5, s, level=s.look_level(1), aa=False)
    assert judge(c, min_effect=0.02, alpha=0.5).label == "faster" == ("faster" if c.faster else "")
    strict = c.model_copy(update={"level": c.p_value / 2})
    v = judge(strict, min_effect=0.02)
    assert v.label == "no significant effect" and f"is not below {c.p_value / 2:.2g}" in v.text
    small = process_compare(list(np.log([1.00, 1.01, 0.99, 1.005, 0.995])), [1.0], s,
                            level=0.01, aa=False)
    assert "lies below the minimum effect of 2%" in judge(small, min_effect=0.02).text
