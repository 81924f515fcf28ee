"""The decision under a server scenario, on metrics a test writes (no clock): the repetition is
the unit, candidates are read against the A/A copy, the minimum effect and Holm's step-down."""

from __future__ import annotations

from pathlib import Path

import pytest

from dossier.scenario import ScenarioSection
from dossier.scenarios.child import ScenarioRequest
from dossier.scenarios.decide import decide, judge
from dossier.scenarios.models import AA, Probe, RunSettings, ScenarioResult

SERVER = ScenarioSection(kind="server", latency_ms=5, processes=5)
RULE = {"min_effect": 0.05, "alpha": 0.05, "confidence": 0.95}


def test_a_consistent_gain_ships() -> None:
    shipped, verdicts = judge(SERVER, "base", {
        "base": [100, 104, 98, 101, 99], AA: [101, 99, 100, 103, 98],
        "two-sessions": [150, 158, 149, 152, 151]}, **RULE)
    assert shipped == "two-sessions"
    (cand, aa) = verdicts
    assert cand.confirmed and cand.level == 0.05 and 1.45 < cand.ratio < 1.6
    assert aa.name == AA and aa.level is None and not aa.confirmed and 0.95 < aa.ratio < 1.05


def test_a_gain_below_the_minimum_effect_does_not_ship() -> None:
    shipped, (cand, _) = judge(SERVER, "base", {
        "base": [100, 100, 100, 100, 100], AA: [100, 100, 100, 100, 100],
        "c": [103, 103, 104, 103, 103]}, **RULE)
    assert shipped == "base" and not cand.confirmed and cand.p_value > 0.5


def test_noise_as_wide_as_the_aa_does_not_ship() -> None:
    shipped, (cand, aa) = judge(SERVER, "base", {
        "base": [100, 60, 140, 90, 110], AA: [70, 130, 100, 150, 80],
        "c": [120, 80, 150, 100, 95]}, **RULE)
    assert shipped == "base" and not cand.confirmed


def test_holm_judges_the_smallest_p_at_alpha_over_m_and_stops_at_the_first_failure() -> None:
    shipped, verdicts = judge(SERVER, "base", {
        "base": [100] * 7, AA: [100, 101, 99, 100, 100, 102, 98],
        "strong": [200, 216, 189, 207, 223, 199, 210], "weak": [107, 112, 104, 109, 106, 99, 107],
        "none": [100, 99, 101, 100, 100, 100, 101]}, **RULE)
    by = {v.name: v for v in verdicts}
    assert by["strong"].confirmed and by["strong"].level == pytest.approx(0.05 / 3)
    assert by["strong"].p_value == 0.5 ** 7  # the sign test: every repetition above 1.05x
    assert shipped == "strong"
    assert not by["none"].confirmed and not by["weak"].confirmed  # one below 1.05x: p = 1
    assert sorted([by["none"].level, by["weak"].level]) == pytest.approx([0.025, 0.05])


def test_repetitions_where_nothing_met_are_not_read_as_ratios() -> None:
    shipped, (cand, _) = judge(SERVER, "base", {
        "base": [100, 100, 100], AA: [100, 100, 100], "c": [0, 0, 300]}, **RULE)
    assert shipped == "base" and cand.ratio is None and "1 of 3 repetitions" in cand.reason


def _req(route: str) -> ScenarioRequest:
    return ScenarioRequest(source="synthetic", route=route,
                           settings=RunSettings(kind="server", qps=1, duration_s=1,
                                                max_duration_s=1))


def test_decide_rotates_the_order_and_starts_each_search_where_it_met_last(tmp_path: Path
                                                                           ) -> None:
    calls: list[tuple[str, float | None, str]] = []
    qps = {"base": 100.0, AA: 100.0, "c": 150.0}

    def measure(name: str, req: ScenarioRequest, work: Path, start: float | None
                ) -> ScenarioResult:
        calls.append((name, start, work.name))
        k = len(calls)
        value = qps[name] * (1 + 0.04 * (k % 3))  # spread beyond the search's resolution
        return ScenarioResult(kind="server", metric_qps=value,
                              probes=[Probe(qps=value, met=True)])

    out = decide(SERVER.model_copy(update={"processes": 6}), ("base", _req("-a=1")),
                 [("c", _req("-a=2"))], tmp_path, measure=measure, **RULE)
    names = [c[0] for c in calls]
    assert names == ["base", AA, "c", AA, "c", "base", "c", "base", AA] * 2
    assert {c[2] for c in calls if c[0] == "c"} == {"02"}  # one folder per configuration
    assert calls[0][1] is None and calls[1][1] == out.reading("base").metric_qps[0]
    assert calls[2][1] == out.reading("base").metric_qps[0]  # none of its own yet
    assert calls[4][1] == out.reading("c").metric_qps[0]
    assert out.shipped == "c" and out.reading("c").route == "-a=2" and out.repetitions == 6


def test_equal_ratios_from_the_rate_grid_are_not_read_as_certain() -> None:
    # the search's rates lie on a grid: an identical copy met 451 where the A/A copy met 282,
    # in each of three repetitions (an A/A on the busy host, 2026-12-06): 1.6x every time,
    # which Student's t alone read as p = 1e-9
    readings = {"base": [451, 226, 451], AA: [282, 282, 247], "copy": [451, 451, 395]}
    shipped, (copy, _) = judge(SERVER, "base", readings, **RULE)
    assert copy.ratio == pytest.approx(1.6, rel=1e-3)
    assert copy.p_value == 0.125 and not copy.confirmed and shipped == "base"  # 0.5 ** 3
    five = {"base": [100] * 5, AA: [100] * 5, "copy": [160] * 5}
    assert judge(SERVER, "base", five, **RULE)[1][0].p_value == 0.5 ** 5  # can still ship
    assert judge(SERVER, "base", five, **RULE)[0] == "copy"


def test_one_repetition_below_the_minimum_effect_stops_a_candidate() -> None:
    # heavy-tailed: four large gains and one loss; the t-test alone would ship it
    readings = {"base": [100] * 5, AA: [100] * 5, "c": [300, 320, 310, 290, 99]}
    shipped, (c, _) = judge(SERVER, "base", readings, **RULE)
    assert shipped == "base" and c.p_value == 1.0 and c.ratio > 2
