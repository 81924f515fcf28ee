"""Timing statistics: rounds as the unit of replication, intervals that cover, tests that hold
their level, and the sampling procedure."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from dossier.measure.timing import (
    REJECTED_ROUNDS,
    Race,
    TimingSettings,
    compare,
    flatten,
    median_ci,
    process_compare,
    process_rounds,
    process_stats,
    sample_rounds,
    shift_interval,
    signed_rank_p,
    summarize,
    unflatten,
)
from dossier.trial import stopped_ahead

SETTINGS = TimingSettings()


def _rounds(rng: np.random.Generator, n_rounds: int, per_block: int, median_ms: float, *,
            shared: np.ndarray, block_sd: float = 0.0, noise: float = 0.03) -> list[list[float]]:
    """Samples per round: a round effect shared by both engines (``shared``), an own block
    effect (``block_sd``, log scale) and per-sample noise (log-normal)."""
    return [list(median_ms * np.exp(shared[r] + rng.normal(0, block_sd)
                                    + rng.normal(0, noise, per_block)))
            for r in range(n_rounds)]


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


def test_shift_interval_is_hodges_lehmann_with_the_signed_rank_interval() -> None:
    x = np.array([0.3, -0.1, 0.7, 0.2, 0.5, 0.4, -0.2, 0.9, 0.1, 0.6])
    est, lo, hi = shift_interval(x, 0.95)
    walsh = sorted((a + b) / 2 for i, a in enumerate(x) for b in x[i:])
    assert est == pytest.approx(np.median(walsh))
    # n=10 at 95%: the 9th smallest and 9th largest Walsh averages (tables: C = 9)
    assert (lo, hi) == (pytest.approx(walsh[8]), pytest.approx(walsh[-9]))
    # the interval and the test agree: 0 is outside exactly when p < 0.05 (no ties here)
    assert (lo > 0) == (signed_rank_p(x) < 0.05)


def test_signed_rank_p_matches_scipy_exact() -> None:
    x = np.array([0.02, -0.01, 0.03, 0.015, 0.04, -0.005, 0.025, 0.011])
    assert signed_rank_p(x) == pytest.approx(stats.wilcoxon(x, method="exact").pvalue)


def test_a_real_five_percent_difference_is_detected_with_an_interval_around_it() -> None:
    rng = np.random.default_rng(3)
    shared = rng.normal(0, 0.05, 16)  # the machine's mood, the same for both in a round
    base = _rounds(rng, 16, 20, 2.0, shared=shared, block_sd=0.01)
    cand = _rounds(rng, 16, 20, 2.0 / 1.05, shared=shared, block_sd=0.01)
    c = compare(base, cand, SETTINGS)
    assert c.faster and not c.slower and c.rounds == 16 and len(c.round_ratios or []) == 16
    assert c.speedup_ci_low > 1.0 and c.speedup_ci_low <= 1.05 <= c.speedup_ci_high
    assert c.test == "wilcoxon-signed-rank-rounds"
    slow = compare(cand, base, SETTINGS)
    assert slow.slower and not slow.faster


def test_identical_engines_are_flagged_at_the_nominal_rate_and_covered() -> None:
    rng = np.random.default_rng(11)
    flagged = covered = 0
    seeds = 400
    for _ in range(seeds):
        shared = rng.normal(0, 0.05, 16)
        base = _rounds(rng, 16, 10, 2.0, shared=shared, block_sd=0.02)
        cand = _rounds(rng, 16, 10, 2.0, shared=shared, block_sd=0.02)
        c = compare(base, cand, SETTINGS)
        flagged += c.significant
        covered += c.speedup_ci_low <= 1.0 <= c.speedup_ci_high
    assert flagged / seeds <= 0.075  # alpha = 0.05, exact test
    assert covered / seeds >= 0.93


def test_block_correlated_drift_fools_a_per_sample_test_but_not_the_rounds() -> None:
    """Each engine's block has its own state (caches, the other engine's threads): samples in a
    block are not independent. A per-sample rank test calls such A/A pairs different most of
    the time; the round-level test holds its level."""
    rng = np.random.default_rng(5)
    per_sample = per_round = 0
    seeds = 200
    for _ in range(seeds):
        shared = rng.normal(0, 0.02, 16)
        base = _rounds(rng, 16, 20, 2.0, shared=shared, block_sd=0.04, noise=0.01)
        cand = _rounds(rng, 16, 20, 2.0, shared=shared, block_sd=0.04, noise=0.01)
        per_sample += stats.mannwhitneyu(flatten(base)[0], flatten(cand)[0]).pvalue < 0.05
        per_round += compare(base, cand, SETTINGS).significant
    assert per_sample / seeds > 0.4
    assert per_round / seeds <= 0.08


def test_rounds_alternate_order_with_lead_in_runs_and_engines_opened_once_a_turn() -> None:
    calls: list[str] = []
    opened: list[str] = []

    def engine(tag: str):  # type: ignore[no-untyped-def]
        def open_block():  # type: ignore[no-untyped-def]
            opened.append(tag)
            return lambda i: calls.append(tag) or 1.0
        return open_block

    settings = TimingSettings(samples=6, rounds=3, block_warmup=1)
    out = sample_rounds([engine("a"), engine("b")], settings, 1)
    assert [[len(b) for b in e] for e in out] == [[2, 2, 2], [2, 2, 2]]
    # A B, B A, A B (each block one untimed lead-in run first); the last engine of a round goes
    # first in the next and stays open for it, every other block opens its engine afresh
    assert "".join(calls) == "aaabbbbbbaaaaaabbb"
    assert "".join(opened) == "abab"


def _fixed(ms: float):  # type: ignore[no-untyped-def]
    """An engine whose every run takes ``ms`` give or take 1%, seeded per engine."""
    rng = np.random.default_rng(int(ms * 1000))
    return lambda: (lambda i: float(ms * np.exp(rng.normal(0, 0.01))))


def test_a_trial_wholly_below_its_bar_stops_at_race_rounds_and_says_why() -> None:
    settings = TimingSettings(samples=32, rounds=8, block_warmup=0, race_rounds=3)
    race = Race(settings, below=0.7, why="the confirmation's floor, 0.70x")
    cand, base = sample_rounds([_fixed(2.0), _fixed(1.0)], settings, 1, stop=race)
    assert len(cand) == len(base) == 3  # 0.5x in every round: out after the third
    assert race.reason is not None and "3 of 8 rounds" in race.reason and "0.700x" in race.reason
    # the same trial above the bar, and a trial with no bar, time every round
    for above in (Race(settings, below=0.4), Race(settings)):
        cand, _ = sample_rounds([_fixed(2.0), _fixed(1.0)], settings, 1, stop=above)
        assert len(cand) == 8 and above.reason is None


def test_a_trial_wholly_above_its_bar_and_the_minimum_effect_stops_ahead() -> None:
    """A 2x route above a 0.7x bar stops after ``race_rounds``, *ahead*, and says so; a route
    only 1% faster (inside the minimum effect) or ahead of no bar times every round, and
    a route the accuracy filter rejected stops as rejected, not ahead."""
    settings = TimingSettings(samples=32, rounds=8, block_warmup=0, race_rounds=3)
    race = Race(settings, below=0.7, why="the confirmation's floor, 0.70x")
    cand, base = sample_rounds([_fixed(0.5), _fixed(1.0)], settings, 1, stop=race)
    assert len(cand) == len(base) == 3
    assert stopped_ahead(race.reason) and "3 of 8 rounds" in (race.reason or "")
    assert "1.020x (1 + the minimum effect)" in (race.reason or "")
    # above the minimum effect, its interval across the bar (the lowest lower end of the
    # routes screened fastest): neither out nor ahead
    high = Race(settings, below=2.0, why="the lowest lower end of the 3 route(s) screened fastest")
    runs = iter([0.45] * 4 + [0.55] * 4 + [0.5] * 100)  # rounds at 2.2x, 1.8x, then 2x
    cand, _ = sample_rounds([lambda: (lambda i: next(runs)), _fixed(1.0)], settings, 1,
                            stop=high)
    assert len(cand) == 8 and high.reason is None
    for race in (Race(settings, below=0.7), Race(settings)):
        cand, _ = sample_rounds([_fixed(1 / 1.01), _fixed(1.0)], settings, 1, stop=race)
        assert len(cand) == 8 and race.reason is None
    cand, _ = sample_rounds([_fixed(2.0), _fixed(1.0)], settings, 1, stop=Race(settings))
    assert len(cand) == 8  # no bar: no confirmation to race for
    rejected = Race(settings, below=0.7, rejected=True)
    sample_rounds([_fixed(0.5), _fixed(1.0)], settings, 1, stop=rejected)
    assert not stopped_ahead(rejected.reason)


def test_a_trial_with_one_round_above_its_bar_is_not_raced() -> None:
    """Over fewer than six rounds the interval is the range of the round ratios: a single round
    at or above the bar keeps the trial going."""
    settings = TimingSettings(samples=8, rounds=4, block_warmup=0, race_rounds=3)
    slow = iter([2.0] * 4 + [1.0] * 2 + [2.0] * 100)  # the third block (2 runs) ties the baseline
    cand, _ = sample_rounds([lambda: (lambda i: next(slow)), _fixed(1.0)], settings, 1,
                            stop=Race(settings, below=0.7))
    assert len(cand) == 4


def test_a_rejected_route_is_timed_two_rounds_only_and_racing_can_be_off() -> None:
    settings = TimingSettings(samples=32, rounds=8, block_warmup=0, race_rounds=3)
    race = Race(settings, rejected=True)
    cand, _ = sample_rounds([_fixed(0.5), _fixed(1.0)], settings, 1, stop=race)  # 2x, rejected
    assert len(cand) == REJECTED_ROUNDS == 2
    assert race.reason is not None and "rejected for accuracy: timed 2 of 8" in race.reason
    off = settings.model_copy(update={"race_rounds": 0})
    cand, _ = sample_rounds([_fixed(2.0), _fixed(1.0)], off, 1,
                           stop=Race(off, below=0.7, rejected=True))
    assert len(cand) == 8
    with pytest.raises(ValueError, match="no interval to race on"):
        TimingSettings(race_rounds=1)


def test_a_warm_up_window_holds_at_most_its_seconds_of_runs() -> None:
    """Two windows of ten 200 ms runs are four seconds of warm-up per engine, trial and
    measuring process; with ``warmup_window_s`` 0.5 a window is two such runs. A fast engine
    keeps its ten-run windows; a warm-up that is not yet steady goes on."""
    from dossier.measure.timing import warm_up

    steady = TimingSettings()  # warmup_min_runs 5, warmup_window 10, warmup_window_s 0.5
    assert warm_up(lambda i: 200.0, steady, 1) == 5  # windows of 2: judged at the 5th run
    assert warm_up(lambda i: 1.0, steady, 1) == 20  # windows of 10
    assert warm_up(lambda i: 200.0, steady.model_copy(update={"warmup_window_s": 0.0}), 1) == 20
    cold = iter([900.0, 700.0, 500.0, 300.0, 250.0, 210.0] + [200.0] * 100)
    runs = warm_up(lambda i: next(cold), steady, 1)
    assert runs == 9  # windows of 2 (the first five's median is 500 ms): 210, 200 against 200, 200


def test_a_screening_lead_in_ends_after_its_seconds_once_one_run_is_done(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A slow engine (a run of 60 ms, as a ResNet-18 pass on 2 cores) takes fewer lead-in runs
    than ``block_warmup`` once ``block_warmup_s`` is spent; a fast one takes them all; 0 keeps
    the count whatever it costs. The runs take their time on a clock the test controls (a busy
    host cannot stretch them)."""
    import types

    from dossier.measure import timing

    calls: list[str] = []
    clock = [0.0]
    monkeypatch.setattr(timing, "time", types.SimpleNamespace(perf_counter=lambda: clock[0]))

    def engine(tag: str, pause_s: float):  # type: ignore[no-untyped-def]
        def run(i: int) -> float:
            calls.append(tag)
            clock[0] += pause_s
            return 1.0
        return lambda: run

    engines = [engine("s", 0.06), engine("f", 0.0)]
    settings = TimingSettings(samples=6, rounds=2, block_warmup=5, block_warmup_s=0.1)
    sample_rounds(engines, settings, 1)
    # per block: the slow engine 2 lead-in runs (0.12 s >= 0.1) then 3 timed; the fast one 5 + 3
    assert "".join(calls) == "sssss" + "ffffffff" + "ffffffff" + "sssss"
    calls.clear()
    sample_rounds(engines, settings.model_copy(update={"block_warmup_s": 0.0}), 1)
    assert calls.count("s") == 2 * (5 + 3)
    calls.clear()
    sample_rounds(engines, settings.model_copy(update={"block_warmup_s": 5.0}), 1)
    assert calls.count("s") == 2 * (5 + 3)


def test_a_measuring_process_rotates_from_its_offset_and_bounds_its_blocks_in_time() -> None:
    """The confirmation's blocks: lead-in runs, then up to ``confirm_runs`` timed runs, ended
    after ``confirm_block_s`` once ten are taken; the first engine rotates from ``offset``."""
    import time

    calls: list[str] = []

    def engine(tag: str, pause_s: float = 0.0):  # type: ignore[no-untyped-def]
        def run(i: int) -> float:
            calls.append(tag)
            time.sleep(pause_s)
            return 1.0
        return lambda: run

    settings = TimingSettings(confirm_rounds=2, confirm_warmup=1, confirm_runs=12,
                              confirm_block_s=0.25)
    out = process_rounds([engine("a"), engine("b"), engine("c", 0.03)], settings, 1, offset=1)
    assert [[len(b) for b in e] for e in out] == [[12, 12], [12, 12], [10, 10]]
    # B C A, then A B C (the last of a round first in the next); one lead-in run a block
    assert "".join(calls) == "b" * 13 + "c" * 11 + "a" * 13 + "a" * 13 + "b" * 13 + "c" * 11


def test_samples_keep_their_round_index() -> None:
    rounds = [[1.0, 2.0], [3.0], [4.0, 5.0, 6.0]]
    samples, index = flatten(rounds)
    assert samples == [1, 2, 3, 4, 5, 6] and index == [0, 0, 1, 2, 2, 2]
    assert unflatten(samples, index) == rounds
    with pytest.raises(ValueError):
        unflatten([1.0], [0, 1])


def test_settings_that_cannot_reach_alpha_are_named() -> None:
    assert TimingSettings().problems() == []
    assert TimingSettings().smallest_p(16) < 0.05 / 16  # room for many comparisons
    few = TimingSettings(rounds=4, confirm_processes=1, confirm_top=3)
    text = " ".join(few.problems())
    assert "timing.rounds=4" in text and "timing.confirm_processes=1" in text


def test_older_settings_still_read() -> None:
    """A tuning cache written before the confirmation's processes keeps its retired field."""
    old = TimingSettings.model_validate({"bootstrap_resamples": 2000, "confirm_processes": 3})
    assert old.confirm_processes == 3 and "bootstrap_resamples" not in old.model_dump()


def test_process_stats_are_students_t_over_processes() -> None:
    logs = [0.9, 1.0, 0.95, 1.1, 0.85]
    st = process_stats(logs, 0.95, bound=np.log(1.02))
    ref = stats.ttest_1samp(logs, np.log(1.02), alternative="greater")
    assert st.p_value == pytest.approx(ref.pvalue)
    lo, hi = stats.t.interval(0.95, 4, loc=np.mean(logs), scale=stats.sem(logs))
    assert (st.low, st.high) == (pytest.approx(lo), pytest.approx(hi))
    half = stats.t.ppf(0.975, 4) * np.std(logs, ddof=1) * np.sqrt(1 + 1 / 5)
    assert st.predict_low == pytest.approx(np.mean(logs) - half)
    two = process_stats(logs, 0.95)  # the A/A's: two-sided against 0
    assert two.p_value == pytest.approx(stats.ttest_1samp(logs, 0.0).pvalue)
    with pytest.raises(ValueError, match="two processes"):
        process_stats([0.1], 0.95)


def test_a_prediction_interval_covers_a_new_process_about_95_percent() -> None:
    """What ``verify --rebench`` relies on: the mean of a fresh set of processes falls inside
    the recorded prediction interval for one new process at least 95% of the time."""
    rng = np.random.default_rng(11)
    inside = 0
    for _ in range(400):
        st = process_stats(rng.normal(1.0, 0.15, 5), 0.95, bound=0.0)
        again = float(np.mean(rng.normal(1.0, 0.15, 5)))
        inside += st.predict_low <= again <= st.predict_high
    assert inside / 400 >= 0.95


def test_a_process_comparison_records_what_it_was_judged_at() -> None:
    logs = list(np.log([2.4, 2.7, 2.5, 3.1, 2.2]))
    c = process_compare(logs, [1.0] * 10, SETTINGS, level=0.01, aa=False)
    assert c.level == 0.01 and c.against == "aa" and c.processes == 5 and c.faster
    assert c.process_speedups == pytest.approx([2.4, 2.7, 2.5, 3.1, 2.2])
    assert c.prediction_low is not None and c.prediction_low < c.speedup_ci_low
    aa = process_compare(list(np.log([1.01, 0.99, 1.0, 1.02, 0.98])), [1.0], SETTINGS,
                         level=0.05, aa=True)
    assert aa.against == "baseline" and not aa.significant and not aa.faster
