"""The decision rule: screening ranks, the confirmation decides. Every record here is built
through the production judge (tests/_records.py), never by hand."""

from __future__ import annotations

import pytest
from _records import confirmed, screened

from dossier.cache import resolve_levels
from dossier.decision import candidates, decide, race_bar, rule_text
from dossier.measure.timing import TimingSettings
from dossier.trial import Comparison, Outcome, TimingSummary, TrialRecord

S = TimingSettings()
BASE = "-a=x"


def test_a_significant_screening_aa_does_not_veto_what_the_confirmation_shows() -> None:
    """The screening A/A reads 1.06x with a tight interval (a biased screening on this host);
    the candidate is confirmed against the A/A load in its own processes, and ships."""
    trials = [screened(0, BASE, 1.06, S, role="baseline", sd=0.005),
              screened(1, "-a=g", 1.3, S)]
    assert trials[0].comparison is not None and trials[0].comparison.faster  # it read apart
    full, _ = confirmed(trials, S, {"-a=g": 1.3})
    d = decide(full, S)
    assert d.gain and d.shipped_route == "-a=g" and d.aa_stops is False
    assert d.aa is not None and d.aa.significant  # recorded, shown, not a veto


def test_screening_ranks_and_the_top_go_on_whatever_they_read() -> None:
    """Screening only ranks: a real gain that screened slower on a loaded host still goes to
    the confirmation, which decides."""
    trials = [screened(0, BASE, 1.0, S, role="baseline"), screened(1, "-a=s", 0.98, S),
              screened(2, "-a=m", 1.1, S), screened(3, "-a=b", 1.5, S),
              screened(4, "-a=r", 2.0, S, outcome=Outcome.REJECTED)]
    found = candidates(trials, S.model_copy(update={"confirm_top": 3}))
    assert [t.route for t in found] == ["-a=b", "-a=m", "-a=s"]  # admissible, best first
    slow_but_real, _ = confirmed(trials[:2], S, {"-a=s": 1.25})
    d = decide(slow_but_real, S)
    assert d.gain and d.shipped_route == "-a=s"  # screened 0.98x, confirmed 1.25x


def test_a_route_screened_wholly_below_the_floor_is_not_confirmed() -> None:
    """A route whose whole screened interval lies below ``confirm_floor`` (0.7x) does not go to
    the confirmation; the decision says why no route was confirmed. With the floor at 0 it
    goes on, as every admissible route did before."""
    trials = [screened(0, BASE, 1.0, S, role="baseline"), screened(1, "-a=slow", 0.5, S),
              screened(2, "-a=near", 0.75, S)]
    assert [t.route for t in candidates(trials, S)] == ["-a=near"]
    only_slow = trials[:2]
    assert candidates(only_slow, S) == []
    d = decide(only_slow, S)
    assert not d.gain and "confirmation floor 0.70x" in d.reason
    off = S.model_copy(update={"confirm_floor": 0.0})
    assert [t.route for t in candidates(only_slow, off)] == ["-a=slow"]
    assert "floor" not in decide(only_slow, off).reason


def test_the_race_bar_is_the_floor_until_the_top_routes_are_screened_then_their_lowest_end() -> None:
    """A screening trial races against the floor, or, once ``confirm_top`` admissible routes
    are screened, the lowest lower end of their intervals: a route wholly below that cannot
    rank among them. A rejected route does not raise the bar; with ``confirm_top = 0`` (the
    screening decides) or racing off, nothing races."""
    top2 = S.model_copy(update={"confirm_top": 2})
    trials = [screened(0, BASE, 1.0, S, role="baseline"), screened(1, "-a=b", 1.5, S),
              screened(2, "-a=r", 3.0, S, outcome=Outcome.REJECTED)]
    assert race_bar(trials, top2) == (0.7, "the confirmation's floor, 0.70x")
    trials.append(screened(3, "-a=m", 1.2, S))
    bar, why = race_bar(trials, top2) or (0.0, "")
    lows = [t.comparison.speedup_ci_low for t in trials[1::2] if t.comparison]
    assert bar == pytest.approx(min(lows)) and 1.0 < bar < 1.2 and "2 route(s)" in why
    assert race_bar(trials, S.model_copy(update={"confirm_top": 0})) is None
    assert race_bar(trials, S.model_copy(update={"race_rounds": 0})) is None


def test_a_confirmed_gain_ships_with_the_confirmations_numbers() -> None:
    trials = [screened(0, BASE, 1.0, S, role="baseline"), screened(1, "-a=y", 1.3, S),
              screened(2, "-a=z", 1.1, S)]
    full, result = confirmed(trials, S, {"-a=y": 1.3, "-a=z": 1.1})
    d = decide(full, S, stopped=result.stopped)
    win = next(t for t in full if t.role == "confirm" and t.route == "-a=y")
    assert win.comparison is not None
    assert d.gain and d.shipped_route == "-a=y" and d.shipped_index == 1
    assert (d.speedup, d.speedup_ci_low, d.speedup_ci_high, d.p_value) == (
        win.comparison.speedup, win.comparison.speedup_ci_low, win.comparison.speedup_ci_high,
        win.comparison.p_value)
    assert d.k == 2 and d.level == pytest.approx(S.alpha / (2 * len(S.looks())))
    assert d.looks == S.looks() and d.processes == result.processes
    assert d.runner_up_route == "-a=z"  # confirmed too, smaller
    assert f"p={win.comparison.p_value:.2g} < {d.level:.2g}" in d.reason
    assert d.candidates == ["-a=y", "-a=z"]  # the confirmation's A/A is not a candidate
    assert d.confirm_aa is not None and d.confirm_aa.processes == result.processes


def test_a_candidate_the_confirmation_does_not_confirm_does_not_ship() -> None:
    """Screened 1.3x faster (a screening fluke), it is another load of the baseline in the
    confirmation: dropped, and the reason names the figures that stopped it."""
    trials = [screened(0, BASE, 1.0, S, role="baseline"), screened(1, "-a=y", 1.3, S)]
    full, result = confirmed(trials, S, {"-a=y": 1.0})
    d = decide(full, S, stopped=result.stopped)
    assert not d.gain and d.shipped_route == BASE
    assert "none was confirmed" in d.reason and "measuring processes" in d.reason
    assert "lies below the minimum effect" in d.reason or "is not below" in d.reason


def test_no_admissible_route_means_no_confirmation() -> None:
    trials = [screened(0, BASE, 1.0, S, role="baseline"),
              screened(1, "-a=y", 1.5, S, outcome=Outcome.REJECTED)]
    d = decide(trials, S)
    assert not d.gain and d.k is None and "no other route was admissible" in d.reason


def test_screening_alone_decides_with_confirm_top_zero() -> None:
    s = S.model_copy(update={"confirm_top": 0})
    trials = [screened(0, BASE, 1.0, s, role="baseline"), screened(1, "-a=y", 1.2, s)]
    d = decide(trials, s)
    assert d.gain and d.shipped_route == "-a=y" and "screening measurement" in d.reason
    assert "screening alone" in d.rule


def test_the_rule_text_states_the_numbers_in_force() -> None:
    text = rule_text(S)
    assert f"the {S.confirm_top} admissible routes screened fastest" in text
    assert "second load of it (the A/A)" in text
    assert "looks after 3, 5, 8, 12, 18, 20 processes" in text and "one-sided" in text
    assert f"{S.confirm_rounds} rotating rounds" in text


def test_an_older_confirmation_record_is_judged_at_alpha_over_k() -> None:
    """Records written before the level was kept (a Mann-Whitney or signed-rank reading with
    no ``level``) are still read: the reader gives them alpha / k, as they were judged then,
    and the rule reads the level it gave."""
    t = TimingSummary(n=10, median_ms=1.0, ci_low_ms=1.0, ci_high_ms=1.0, mean_ms=1.0,
                      p10_ms=1.0, p90_ms=1.0, warmup_runs=0)

    def old(index: int, route: str, role: str, p: float) -> TrialRecord:
        return TrialRecord(index=index, route=route, role=role, outcome=Outcome.OK,  # type: ignore[arg-type]
                           timing=t, trial_s=1.0, started_at="2026-01-01T00:00:00+00:00",
                           comparison=Comparison(baseline=t, speedup=1.2, speedup_ci_low=1.1,
                                                 speedup_ci_high=1.3, p_value=p,
                                                 significant=True, faster=True, slower=False,
                                                 procedure="independent"))

    base = [old(0, BASE, "baseline", 0.9), old(1, "-a=y", "search", 1e-4),
            old(2, "-a=z", "search", 1e-4), old(3, BASE, "confirm", 0.9)]
    two = [old(4, "-a=y", "confirm", 0.03), old(5, "-a=z", "confirm", 0.03)]
    assert not decide(resolve_levels([*base, *two], S.alpha), S).gain  # 0.03 is not below 0.05 / 2
    one = resolve_levels([*base, *two[:1]], S.alpha)
    assert decide(one, S).gain  # one candidate: 0.03 < 0.05
    with pytest.raises(ValueError, match="without the level"):
        decide([*base, *two[:1]], S)  # never read: no level to judge at
