"""Comparison.verdict: the word printed beside a speedup follows from that speedup, its interval,
its p-value and the level the reading records, in every combination."""

from __future__ import annotations

import pytest

from dossier.trial import Comparison, TimingSummary

_T = TimingSummary(n=60, median_ms=1.0, ci_low_ms=0.9, ci_high_ms=1.1, mean_ms=1.0, p10_ms=0.9,
                   p90_ms=1.1, warmup_runs=5)


def _c(speedup: float, lo: float, hi: float, p: float) -> Comparison:
    return Comparison(baseline=_T, speedup=speedup, speedup_ci_low=lo, speedup_ci_high=hi,
                      p_value=p, significant=p < 0.05, faster=False, slower=False,
                      level=0.05)


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
    v = c.verdict(min_effect=0.02)
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

    logs = list(np.log([1.30, 1.25, 1.28, 1.35, 1.27]))
    s = TimingSettings()
    c = process_compare(logs, [1.0] * 5, s, level=s.look_level(1), aa=False)
    assert c.verdict(min_effect=0.02).label == "faster" == ("faster" if c.faster else "")
    strict = c.model_copy(update={"level": c.p_value / 2})
    v = strict.verdict(min_effect=0.02)
    assert v.label == "no significant effect" and f"is not below {c.p_value / 2:.2g}" in v.text
    small = process_compare(list(np.log([1.00, 1.01, 0.99, 1.005, 0.995])), [1.0], s,
                            level=0.01, aa=False)
    assert "lies below the minimum effect of 2%" in small.verdict(min_effect=0.02).text


def test_a_reading_without_its_level_is_refused() -> None:
    """No caller supplies a level: a comparison that records none was never read through the
    tuning cache (which resolves older records' levels), and judging it is a bug."""
    c = _c(1.10, 1.05, 1.15, 1e-6).model_copy(update={"level": None})
    with pytest.raises(ValueError, match="without the level"):
        c.verdict(min_effect=0.02)


ROOT = __import__("pathlib").Path(__file__).resolve().parents[2]
READING = "dossier/measure/reading.py"
def _effect_comparisons(path: __import__("pathlib").Path) -> list[int]:
    """Lines of ``path`` whose code (not prose) computes 1 + min_effect or log1p(min_effect)."""
    import ast

    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add) \
                and any(isinstance(s, ast.Constant) and s.value == 1
                        for s in (node.left, node.right)) \
                and "min_effect" in ast.unparse(node):
            found.append(node.lineno)
        elif isinstance(node, ast.Call) and ast.unparse(node.func).endswith("log1p") \
                and "min_effect" in ast.unparse(node):
            found.append(node.lineno)
    return found


def test_only_the_reading_compares_against_the_minimum_effect() -> None:
    """Faster, slower and "gain enough" are decided by the reading
    (:mod:`dossier.measure.reading`): no other module of the library or the CLI compares a
    speedup against 1 + min_effect (or log(1 + min_effect)) itself."""
    files = [p for d in ("dossier", "cli") for p in sorted((ROOT / d).rglob("*.py"))]
    assert len(files) > 100
    seen = {str(p.relative_to(ROOT)): _effect_comparisons(p) for p in files}
    assert seen[READING], "the reading itself compares (the scan finds what it looks for)"
    outside = {f: lines for f, lines in seen.items()
               if lines and f != READING}
    assert outside == {}


def test_the_reading_names_the_tests_timing_records() -> None:
    """The reading judges by the test a comparison names (the confirmation's is one-sided): the
    names it knows are the ones the statistics write."""
    from dossier.measure import reading, timing

    assert (timing.TEST_NAME, timing.PROCESS_TEST) == (reading.ROUNDS_TEST, reading.PROCESS_TEST)
