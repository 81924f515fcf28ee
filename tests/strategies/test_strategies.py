"""Search strategies (fast / full / mixed) follow trtexec's semantics on every backend's knobs.

Each test runs over two knob databases: a TensorRT one parsed from JSON written per the
documented ``all_build_routes`` format (not captured from TensorRT), and the real ONNX Runtime
knob database of this host. In both selections a varied knob's default is not among its listed
values, the case where trtexec's baseline still takes the knob database's default.
"""

from __future__ import annotations

import itertools
import json
import math
from dataclasses import dataclass

import pytest

from dossier.backends.onnxruntime import OnnxRuntimeBackend
from dossier.backends.tensorrt import parse_knob_json
from dossier.errors import SelectionError
from dossier.knobs import KnobDatabase
from dossier.routes import Route, Selection
from dossier.strategies import STRATEGIES, FastStrategy, FullStrategy, MixedStrategy, get_strategy
from dossier.strategies.fast import one_offs

# Follows the documented all_build_routes format; not captured output.
TRT_KNOBS = json.dumps({"tuner_version": "2.19.15", "tuner_options": [
    {"option": "-conv_use_long_w", "allowed_values": "-conv_use_long_w=[on|off]",
     "default_value": "on", "help": ""},
    {"option": "-kgen:codegen:cuda_tile", "allowed_values": "-kgen:codegen:cuda_tile=[0|1|2]",
     "default_value": "0", "help": ""},
    {"option": "-kgen:tiling", "allowed_values": "-kgen:tiling=[none|auto|aggressive]",
     "default_value": "auto", "help": ""},
    {"option": "-match_ragged_mha", "allowed_values": "-match_ragged_mha=[on|off]",
     "default_value": "off", "help": ""},
    {"option": "-peep:max", "allowed_values": "-peep:max=int32_t", "default_value": "16",
     "help": ""},
]})


@dataclass(frozen=True)
class Case:
    """A knob database and a selection over it."""

    name: str
    db: KnobDatabase
    selection: Selection
    unlisted_default: str
    """A varied knob whose database default is not among its listed values."""


@pytest.fixture(scope="module", params=["tensorrt", "onnxruntime"])
def case(request: pytest.FixtureRequest) -> Case:
    if request.param == "tensorrt":
        db = parse_knob_json(TRT_KNOBS)
        text = ("-conv_use_long_w=[off|on] -peep:max=8 -kgen:tiling=[none|aggressive] "
                "-match_ragged_mha=on -kgen:codegen:cuda_tile=[2|0|1]")
        unlisted = "kgen:tiling"
    else:
        db = OnnxRuntimeBackend().knob_database()
        text = ("-graph_optimization_level=[basic|extended] -enable_mem_pattern=off "
                "-execution_mode=[parallel|sequential] -optimizer:ConvBNFusion=[off|on] "
                "-intra_op_num_threads=[1|0|4]")
        unlisted = "graph_optimization_level"
    return Case(request.param, db, Selection.parse(text, db), unlisted)


def _defaults(case: Case) -> dict[str, str]:
    return {k.name: k.default for k in case.db.knobs}


# ---------------------------------------------------------------------------------------- full

def test_full_count_is_product_of_list_lengths(case):
    routes = FullStrategy().plan(case.selection, case.db)
    assert len(routes) == math.prod(len(i.values) for i in case.selection.items)
    assert FullStrategy().count(case.selection, case.db) == len(routes)
    assert len({r.text() for r in routes}) == len(routes)


def test_full_last_knob_changes_fastest(case):
    items = case.selection.items
    expected = [Route.of(zip([i.knob for i in items], combo))
                for combo in itertools.product(*[i.values for i in items])]
    routes = FullStrategy().plan(case.selection, case.db)
    assert routes == expected
    last = items[-1]
    assert not last.pinned
    for a, b in zip(routes[:len(last.values) - 1], routes[1:len(last.values)]):
        changed = {k for k, v in a.as_dict().items() if b.as_dict()[k] != v}
        assert changed == {last.knob}


# ---------------------------------------------------------------------------------------- fast

def test_fast_count(case):
    defaults = _defaults(case)
    expected = 1 + sum(len([v for v in i.values if v != defaults[i.knob]])
                       for i in case.selection.varied)
    assert len(FastStrategy().plan(case.selection, case.db)) == expected
    assert FastStrategy().count(case.selection, case.db) == expected


def test_fast_baseline_uses_db_default_even_when_not_listed(case):
    base = FastStrategy().plan(case.selection, case.db)[0].as_dict()
    defaults = _defaults(case)
    listed = {i.knob: i.values for i in case.selection.items}
    assert defaults[case.unlisted_default] not in listed[case.unlisted_default]
    assert base[case.unlisted_default] == defaults[case.unlisted_default]
    for item in case.selection.items:
        assert base[item.knob] == (item.values[0] if item.pinned else defaults[item.knob])
    assert FastStrategy().plan(case.selection, case.db)[0] == case.selection.baseline(case.db)


def test_fast_one_offs_right_to_left_in_listed_order_skipping_default(case):
    defaults = _defaults(case)
    base = case.selection.baseline(case.db).as_dict()
    expected = [Route.of({**base, item.knob: v})
                for item in reversed(case.selection.varied)
                for v in item.values if v != defaults[item.knob]]
    routes = FastStrategy().plan(case.selection, case.db)
    assert routes[1:] == expected
    for route in routes[1:]:  # each one-off changes exactly one knob of the baseline
        assert len({k for k, v in route.as_dict().items() if base[k] != v}) == 1
    pinned = {i.knob: i.values[0] for i in case.selection.items if i.pinned}
    assert pinned and all(r.as_dict()[k] == v for r in routes for k, v in pinned.items())


# --------------------------------------------------------------------------------------- mixed

@dataclass(frozen=True)
class Judged:
    """What the tuner tells a strategy about a finished trial."""

    admissible: bool
    faster: bool


def _run(strategy, case: Case, judge) -> list[Route]:  # type: ignore[no-untyped-def]
    """Drive a strategy the way the tuner does: record each route's result before the next."""
    results: dict[str, Judged] = {}
    routes = []
    for route in strategy.routes(case.selection, case.db, results):
        routes.append(route)
        results[route.text()] = judge(route)
    return routes


def _positive_one_offs(case: Case, n: int) -> dict[str, str]:
    """{route text: knob} for the first one-off of each of ``n`` different knobs."""
    chosen: dict[str, str] = {}
    for knob, route in one_offs(case.selection, case.db):
        if knob not in chosen.values() and len(chosen) < n:
            chosen[route.text()] = knob
    return chosen


def test_mixed_cannot_plan_ahead():
    assert MixedStrategy.plans_ahead is False
    assert FastStrategy.plans_ahead is True and FullStrategy.plans_ahead is True


def test_mixed_phase1_is_fast(case):
    fast = FastStrategy().plan(case.selection, case.db)
    assert _run(MixedStrategy(), case, lambda r: Judged(True, False)) == fast
    assert MixedStrategy().count(case.selection, case.db) >= len(fast)


@pytest.mark.parametrize("n_positive", [0, 1])
def test_mixed_no_phase2_below_two_positive_knobs(case, n_positive):
    positive = _positive_one_offs(case, n_positive)
    routes = _run(MixedStrategy(), case, lambda r: Judged(True, r.text() in positive))
    assert routes == FastStrategy().plan(case.selection, case.db)


def test_mixed_phase2_full_over_positive_knobs_only(case):
    positive = _positive_one_offs(case, 2)
    knobs = set(positive.values())
    assert len(knobs) == 2
    routes = _run(MixedStrategy(), case, lambda r: Judged(True, r.text() in positive))
    fast = FastStrategy().plan(case.selection, case.db)
    assert routes[:len(fast)] == fast
    base = case.selection.baseline(case.db).as_dict()
    items = case.selection.items
    full = [Route.of(zip([i.knob for i in items], combo)) for combo in itertools.product(
        *[i.values if i.knob in knobs else (base[i.knob],) for i in items])]
    seen = {r.text() for r in fast}
    assert routes[len(fast):] == [r for r in full if r.text() not in seen]
    assert routes[len(fast):]  # phase 2 ran
    for route in routes[len(fast):]:
        assert {k for k, v in route.as_dict().items() if base[k] != v} <= knobs


def test_mixed_positive_needs_admissible_and_faster(case):
    positive = _positive_one_offs(case, 2)
    first, second = positive
    # faster but rejected (an accuracy failure) does not count: trtexec would have counted it
    judge = {first: Judged(False, True), second: Judged(True, True)}
    routes = _run(MixedStrategy(), case, lambda r: judge.get(r.text(), Judged(True, False)))
    assert routes == FastStrategy().plan(case.selection, case.db)
    judge = {first: Judged(True, False), second: Judged(True, True)}
    routes = _run(MixedStrategy(), case, lambda r: judge.get(r.text(), Judged(True, False)))
    assert routes == FastStrategy().plan(case.selection, case.db)


# --------------------------------------------------------------------------------------- lookup

def test_strategy_registry():
    assert set(STRATEGIES) == {"fast", "full", "mixed", "random", "budget"}
    assert isinstance(get_strategy("mixed"), MixedStrategy)
    with pytest.raises(SelectionError, match="unknown strategy"):
        get_strategy("exhaustive")


def test_routes_known_ahead_are_what_the_strategy_then_yields(case):
    """Builds start for the routes a strategy knows ahead: every route of fast and full, and
    for mixed phase 1 only until phase 1 is measured, then phase 2 as the strategy yields it."""
    for strategy in (FastStrategy(), FullStrategy()):
        assert strategy.ahead(case.selection, case.db, {}) == strategy.plan(case.selection, case.db)
    positive = _positive_one_offs(case, 2)
    mixed = MixedStrategy()
    fast = FastStrategy().plan(case.selection, case.db)
    results: dict[str, Judged] = {}
    assert mixed.ahead(case.selection, case.db, results) == fast
    for route in fast[:-1]:
        results[route.text()] = Judged(True, route.text() in positive)
        assert mixed.ahead(case.selection, case.db, results) == fast  # phase 2 not decided yet
    results[fast[-1].text()] = Judged(True, fast[-1].text() in positive)
    expected = _run(mixed, case, lambda r: Judged(True, r.text() in positive))
    assert mixed.ahead(case.selection, case.db, results) == expected and len(expected) > len(fast)
