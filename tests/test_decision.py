"""The decision rule: the A/A trial as the run's calibration, and the independent confirmation."""

from __future__ import annotations

from dossier.decision import candidates, decide, rule_text
from dossier.timing import TimingSettings
from dossier.trial import Comparison, Outcome, TimingSummary, TrialRecord

S = TimingSettings()
BASE = "-a=x"


def _summary(ms: float) -> TimingSummary:
    return TimingSummary(n=320, median_ms=ms, ci_low_ms=ms * 0.99, ci_high_ms=ms * 1.01,
                         mean_ms=ms, p10_ms=ms * 0.97, p90_ms=ms * 1.03, warmup_runs=5)


def _trial(index: int, route: str, speedup: float, lo: float, hi: float, p: float, *,
           role: str = "search", procedure: str = "screening") -> TrialRecord:
    sig = p < S.alpha
    return TrialRecord(
        index=index, route=route, role=role, outcome=Outcome.OK,  # type: ignore[arg-type]
        timing=_summary(10.0 / speedup),
        comparison=Comparison(baseline=_summary(10.0), speedup=speedup, speedup_ci_low=lo,
                              speedup_ci_high=hi, p_value=p, significant=sig,
                              faster=sig and speedup >= 1 + S.min_effect,
                              slower=sig and speedup <= 1 / (1 + S.min_effect),
                              rounds=16, procedure=procedure, test="wilcoxon-signed-rank-rounds"),
        trial_s=1.0, started_at="2026-01-01T00:00:00+00:00")


def _confirm(index: int, route: str, speedup: float, lo: float, hi: float, p: float) -> TrialRecord:
    return _trial(index, route, speedup, lo, hi, p, role="confirm", procedure="independent")


def test_a_significant_aa_ships_nothing_and_says_why() -> None:
    """The tblock case: the A/A reads 1.055x, and a 1.09x candidate is no better than that."""
    trials = [_trial(0, BASE, 1.055, 1.048, 1.065, 0.001, role="baseline"),
              _trial(1, "-a=y", 1.09, 1.07, 1.11, 0.0001)]
    d = decide(trials, S)
    assert not d.gain and d.shipped_route == BASE
    assert "A/A check" in d.reason and "1.055x [1.048, 1.065]" in d.reason
    assert d.aa is not None and d.aa.significant and d.aa.rounds == 16
    assert "second load of itself" in d.rule


def test_a_gain_must_clear_the_aa_interval_in_screening() -> None:
    aa = _trial(0, BASE, 1.01, 0.995, 1.035, 0.2, role="baseline")  # not significant
    inside = _trial(1, "-a=y", 1.04, 1.03, 1.05, 0.001)  # lower end 1.03 < A/A upper 1.035
    clear = _trial(2, "-a=z", 1.06, 1.045, 1.08, 0.001)
    found = candidates([aa, inside, clear], S)
    assert [t.route for t in found] == ["-a=z"]


def test_confirmed_gain_ships_with_the_independent_numbers() -> None:
    trials = [_trial(0, BASE, 1.0, 0.99, 1.01, 0.6, role="baseline"),
              _trial(1, "-a=y", 1.10, 1.08, 1.12, 0.0001),
              _confirm(2, BASE, 1.002, 0.99, 1.01, 0.7),
              _confirm(3, "-a=y", 1.08, 1.05, 1.11, 0.001)]
    d = decide(trials, S)
    assert d.gain and d.shipped_route == "-a=y" and d.shipped_index == 1
    assert (d.speedup, d.speedup_ci_low, d.speedup_ci_high) == (1.08, 1.05, 1.11)
    assert "confirmed independently" in d.reason and d.confirm_aa is not None
    assert d.candidates == ["-a=y"]  # the confirmation's A/A is not a candidate


def test_confirmation_interval_must_exclude_one_and_clear_its_aa() -> None:
    base = [_trial(0, BASE, 1.0, 0.99, 1.01, 0.6, role="baseline"),
            _trial(1, "-a=y", 1.10, 1.08, 1.12, 0.0001)]
    wide = decide([*base, _confirm(2, BASE, 1.0, 0.99, 1.01, 0.7),
                   _confirm(3, "-a=y", 1.05, 0.999, 1.09, 0.001)], S)
    assert not wide.gain and "includes 1.0" in wide.reason
    under_aa = decide([*base, _confirm(2, BASE, 1.01, 0.99, 1.04, 0.3),
                       _confirm(3, "-a=y", 1.05, 1.03, 1.08, 0.001)], S)
    assert not under_aa.gain and "confirmation A/A reading's upper end 1.040" in under_aa.reason
    biased = decide([*base, _confirm(2, BASE, 1.04, 1.02, 1.06, 0.001),
                     _confirm(3, "-a=y", 1.10, 1.08, 1.12, 0.001)], S)
    assert not biased.gain and "confirmation's A/A check" in biased.reason


def test_the_rule_text_states_the_aa_condition() -> None:
    text = rule_text(S)
    assert "lower end above the A/A interval's upper end" in text
    assert f"{S.confirm_rounds} rounds" in text and "fresh process per engine" in text


def test_an_aa_below_the_minimum_effect_does_not_stop_a_gain_that_clears_it() -> None:
    """Judged like a candidate: on the H200 a screening A/A read 1.008x (p=0.0098), a
    difference no candidate could ship with, and the rule threw away a 3.6x gain. Such a reading
    no longer stops the release, but the gain must still clear its interval."""
    small = _trial(0, BASE, 1.008, 1.003, 1.020, 0.0098, role="baseline")
    win = [_trial(1, "-a=y", 3.6, 3.5, 3.7, 0.0001), _confirm(2, BASE, 1.0, 0.97, 1.03, 0.8),
           _confirm(3, "-a=y", 3.1, 2.7, 3.5, 0.001)]
    d = decide([small, *win], S)
    assert d.gain and d.shipped_route == "-a=y"
    assert d.aa is not None and not d.aa.significant and d.aa.p_value < S.alpha
    close = decide([small, _trial(1, "-a=y", 1.03, 1.015, 1.05, 0.001)],
                   S.model_copy(update={"confirm_top": 0}))
    assert not close.gain and "A/A reading's upper end 1.020" in close.reason
    slow = decide([_trial(0, BASE, 0.975, 0.96, 0.99, 0.004, role="baseline"), *win], S)
    assert not slow.gain and "A/A check" in slow.reason  # 2.5% apart: at least the effect


def test_the_rule_text_names_the_generations_interval() -> None:
    assert "generation" not in rule_text(S)
    text = rule_text(S.model_copy(update={"confirm_processes": 3}))
    assert "3 process generations" in text and "new generation's reading" in text
    assert f"by {S.min_effect:.0%} or more" in text
