"""The budgeted search: the landscape's known optimum, the budget's account and stopping rule,
TPE proposals within the budget, an exact resume, the dry run and the account in explain."""

from __future__ import annotations

import itertools
import math
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from dossier_test_backends.landscape.space import Landscape

from dossier.cache import TuningCache
from dossier.errors import InputError
from dossier.routes import Route
from dossier.strategies import BudgetStrategy, RandomStrategy, get_strategy, local
from dossier.strategies.budget import STUDY_NAME
from dossier.strategies.spend import Limits, account
from dossier.trial import Outcome

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))
from bench import replay  # noqa: E402


@dataclass(frozen=True)
class _C:
    speedup: float


@dataclass(frozen=True)
class _T:
    route: str
    outcome: Outcome
    comparison: _C | None
    trial_s: float = 1.0


def _ok(route: str, s: float, trial_s: float = 1.0) -> _T:
    return _T(route, Outcome.OK, _C(s), trial_s)


def test_the_landscape_optimum_is_the_best_feasible_route_of_all() -> None:
    land = Landscape.generate(knobs=9, seed=3)
    best, speed = land.optimum()
    routes = [dict(zip(land.knobs, combo)) for combo in itertools.product(*land.values.values())]
    feasible = [r for r in routes if land.feasibility(r) == "ok"]
    assert len(feasible) < len(routes)  # it has infeasible regions
    assert land.feasibility(best) == "ok"
    assert speed == pytest.approx(max(land.speedup(r) for r in feasible))
    assert land.feasibility(land.default()) == "ok" and land.speedup(land.default()) == 1.0


def test_the_account_stops_on_builds_seconds_and_patience() -> None:
    trials = [_ok("b", 1.0), _ok("s1", 1.10), _ok("s2", 1.11), _ok("s3", 1.05)]
    assert "3 builds" in (account(trials, Limits(max_builds=3), 1).stop or "")
    assert account(trials, Limits(max_builds=5), 1).stop is None
    assert account(trials, Limits(max_search_s=3.5), 1).stop == \
        "the budget of 3.5 s of trials is spent (4.0 s)"
    assert account(trials, Limits(max_search_s=4.5), 1).stop is None
    # after the start (2 trials): s2 (+0.9%) and s3 do not beat 1.10 by 2%: two misses
    a = account(trials, Limits(max_builds=99, patience=2), 2)
    assert a.misses == 2 and a.best == pytest.approx(1.11) and a.best_route == "s2"
    assert a.stop is not None and a.stop.startswith("no gain: 2 proposals")
    assert a.improved_at == [1]
    failed = _T("f", Outcome.BUILD_FAILED, None)
    assert account([*trials[:2], failed], Limits(max_builds=99, patience=1), 2).stop


def test_strategies_without_a_budget_are_refused(sample) -> None:
    _, spec = sample("convnet", strategy="budget")
    with pytest.raises(InputError, match="needs a budget"):
        get_strategy("budget", spec)
    _, spec = sample("convnet", strategy="random", max_builds=3)
    assert isinstance(get_strategy("random", spec), RandomStrategy)


def _walk(space: replay.Space, strategy: BudgetStrategy, results: dict[str, replay.Replayed],
          stop_after: int | None = None) -> list[str]:
    """Drive ``strategy`` as the tuner does; with ``stop_after``, drop it after that many
    routes were yielded, the last one unmeasured (a kill between proposal and record)."""
    base = space.selection.baseline(space.db)
    results.setdefault(base.text(), space.measure(base, 0))
    order = []
    for route in strategy.routes(space.selection, space.db, results):
        order.append(route.text())
        if stop_after is not None and len(order) == stop_after:
            return order
        results[route.text()] = space.measure(route, 0)
    return order


def test_budget_stays_in_budget_and_tells_failures_as_infeasible(tmp_path: Path) -> None:
    space = replay.landscape_space(12, 0.01, 1)
    s = BudgetStrategy(Limits(max_builds=40, patience=1000), seed=2)
    s.open(tmp_path)
    results: dict[str, replay.Replayed] = {}
    _walk(space, s, results)
    assert len(results) == 40 and s.stopped and "40 builds" in s.stopped
    study = BudgetStrategy.open_study(tmp_path / STUDY_NAME)
    done = [t for t in study.trials if t.state.name == "COMPLETE"]
    assert done and study.user_attrs["stopped"] == s.stopped
    for t in done:
        r = results[Route.of({k: str(v) for k, v in t.params.items()}).text()]
        assert (t.constraints["admissible"] > 0) == (r.outcome is not Outcome.OK)
    assert any(r.outcome is not Outcome.OK for r in results.values())


def test_budget_goes_past_its_structured_start_on_the_landscape() -> None:
    """The proposals combine knobs, and what they find beats the best one-knob route (the
    comparison with random is the benchmark's: bench/results/replay-landscape-30.md)."""
    space = replay.landscape_space(16, 0.01, 4)
    shares = {name: replay.walk(space, name, 80, seed=0)[-1] for name in ("fast", "budget")}
    assert shares["budget"] > shares["fast"] + 0.05


_SPACE6 = replay.landscape_space(6, 0.01, 0)


def _full(text: str) -> str:
    """``text`` with every knob of the 6-knob landscape's selection (as the tuner keys routes)."""
    return Route.of({**_SPACE6.selection.baseline(_SPACE6.db).as_dict(),
                     **Route.parse(text).as_dict()}).text()


def _evidence(measured: dict[str, _T]) -> local.Evidence:
    """The evidence of ``measured`` over the 6-knob landscape's selection (baseline first)."""
    return local.Evidence.read(_SPACE6.selection, _SPACE6.db, measured)  # type: ignore[arg-type]


def _put(measured: dict[str, _T], text: str, r: float | Outcome) -> None:
    route = _full(text)
    measured[route] = _ok(route, r) if isinstance(r, float) else _T(route, r, None)


def _start(**one_offs: float | Outcome) -> dict[str, _T]:
    """The baseline and one-knob routes ``k00_v1=1.10`` (a speedup, or how it failed)."""
    out: dict[str, _T] = {}
    _put(out, "", 1.0)
    for name, r in one_offs.items():
        _put(out, "-" + name.replace("_", "="), r)
    return out


def test_moves_of_the_best_route_go_by_expected_gain_and_skip_predicted_failures() -> None:
    measured = _start(k00_v1=1.10, k01_v1=1.05, k03_v1=1.03, k02_v1=Outcome.REJECTED)
    e = _evidence(measured)
    assert e.best == {**e.base, "k00": "v1"} and e.alone == {("k02", "v1"): Outcome.REJECTED}
    floor = math.log1p(0.02)
    step = local.step(e, floor)
    assert step is not None and step.text() == _full("-k00=v1 -k01=v1")  # +5% before +3%
    _put(measured, "-k00=v1 -k01=v1", Outcome.BUILD_FAILED)
    e = _evidence(measured)
    assert e.moved == {("k01", "v1"): None}
    assert e.fails({**e.best, "k01": "v1", "k03": "v1"})  # holds the failed pair
    step = local.step(e, floor)
    assert step is not None and step.text() == _full("-k00=v1 -k03=v1")
    _put(measured, "-k00=v1 -k03=v1", 1.08)  # worse in context
    e = _evidence(measured)
    assert local.step(e, floor) is None and local.step(e, 0.0) is None
    # each setting of the best route that helped alone is moved once in context, whatever the
    # expected gain (taken out, or its knob set to another value that helped alone)
    measured = _start(k00_v1=1.10, k03_v1=1.05, k00_v2=1.04, k01_v1=1.005)
    _put(measured, "-k00=v1 -k01=v1 -k03=v1", 1.16)
    e = _evidence(measured)
    step = local.step(e, -math.inf, untried=floor)
    assert step is not None and step.text() == _full("-k00=v1 -k01=v1")  # -k03: -5% expected
    _put(measured, step.text(), 1.11)
    step = local.step(_evidence(measured), -math.inf, untried=floor)
    assert step is not None and step.text() == _full("-k00=v2 -k01=v1 -k03=v1")  # -6%
    _put(measured, step.text(), 1.09)
    step = local.step(_evidence(measured), -math.inf, untried=floor)
    assert step is not None and step.text() == _full("-k01=v1 -k03=v1")  # -10%
    _put(measured, step.text(), 1.05)
    # k01=v1 did nothing alone: taking it out is not checked
    assert local.step(_evidence(measured), -math.inf, untried=floor) is None


def test_a_repair_tests_partners_in_groups_and_rules_out_those_that_did_not_help() -> None:
    import random

    measured = _start(k00_v1=1.10, k02_v1=Outcome.REJECTED)
    s = ("k02", "v1")
    seen: set[tuple[str, str]] = set()
    route: Route | None = None
    for _ in range(30):
        e = _evidence(measured)
        assert local.repairable(e) == [s]
        route = local.repair(e, s, random.Random(0), group=2)
        if route is None:
            break
        moved = {(k, v) for k, v in route.as_dict().items() if e.best.get(k) != v} - {s}
        assert s in route.values and 1 <= len(moved) <= 2 and not moved & seen
        seen |= moved
        _put(measured, route.text(), Outcome.REJECTED)  # not repaired
    e = _evidence(measured)
    assert route is None and e.attempts[s] >= 3 and e.ruled_out[s] == seen
    # the free knobs' values first, then the other values of the knob the best route sets
    assert ("k00", "v2") in seen and not local.partners(e, s)
    # a route that fails otherwise (a build failure) rules nothing out
    measured = _start(k00_v1=1.10, k02_v1=Outcome.REJECTED)
    _put(measured, "-k00=v1 -k02=v1 -k03=v1", Outcome.BUILD_FAILED)
    assert ("k03", "v1") in local.partners(_evidence(measured), s)
    # partners of a route that failed otherwise are suspects: at most one of them a group
    _put(measured, "-k00=v1 -k02=v1 -k01=v1 -k04=v1", Outcome.BUILD_FAILED)
    e = _evidence(measured)
    assert e.suspects[s] == {("k01", "v1"), ("k03", "v1"), ("k04", "v1")}
    for seed in range(10):
        route = local.repair(e, s, random.Random(seed), group=4)
        assert route is not None and len(e.suspects[s] & set(route.values)) <= 1
    # a repair that works takes the setting off the list and becomes the best route
    _put(measured, "-k00=v1 -k02=v1 -k05=v2", 1.2)
    e = _evidence(measured)
    assert local.repairable(e) == [] and e.best == {**e.base, "k00": "v1", "k02": "v1",
                                                   "k05": "v2"}


def test_a_repair_that_works_but_is_slower_is_moved_towards_the_best_route() -> None:
    measured = _start(k00_v1=1.10, k03_v1=0.95, k02_v1=Outcome.REJECTED)
    _put(measured, "-k00=v1 -k02=v1 -k03=v1 -k05=v2", 1.08)  # admissible, slower than 1.10
    e = _evidence(measured)
    assert local.repairable(e) == [] and e.best == {**e.base, "k00": "v1"}
    # undo the partner that slowed it down (k05=v2 has no one-knob route: no expectation)
    route = local.settle(e)
    assert route is not None and route.text() == _full("-k00=v1 -k02=v1 -k05=v2")
    _put(measured, route.text(), 1.13)
    e = _evidence(measured)
    assert ("k02", "v1") in e.settings(e.best) and local.settle(e) is None


def test_budget_repairs_what_fails_alone_and_reaches_the_landscape_optimum() -> None:
    """On the 30-knob landscape the optimum holds a setting that breaks accuracy unless a
    partner setting comes with it: the budget's pick holds it, within 2% of the optimum."""
    space = replay.landscape_space(30, 0.01, 0)
    s = BudgetStrategy(Limits(max_builds=150), seed=0)
    s.open(None)
    results: dict[str, replay.Replayed] = {}
    _walk(space, s, results)
    pick = max((r for r in results.values() if r.comparison is not None),
               key=lambda r: r.comparison.speedup)  # type: ignore[union-attr]
    assert pick.true_speedup is not None and pick.true_speedup >= 0.98 * space.optimum
    e = local.Evidence.read(space.selection, space.db, results)
    assert e.settings(Route.parse(pick.route).as_dict()) & set(e.alone)  # a repaired setting


@pytest.mark.parametrize(("max_builds", "cut"), [(30, 22), (20, 9)],
                         ids=["among-proposals", "inside-the-ascent"])
def test_a_resumed_search_makes_the_same_proposals(tmp_path: Path, max_builds: int,
                                                   cut: int) -> None:
    """Killed after route ``cut`` was asked (never measured), a journal line cut short: the
    resumed search makes the proposals of one never stopped. 20 builds are under twice the
    15-route start of this space, so the second case is killed inside the ascent."""
    space = replay.landscape_space(10, 0.01, 2)
    limits = Limits(max_builds=max_builds, patience=1000)
    whole = BudgetStrategy(limits, seed=5)
    assert whole.ascends(space.selection, space.db) == (max_builds == 20)
    whole.open(tmp_path / "whole")
    (tmp_path / "whole").mkdir()
    reference = _walk(space, whole, {})
    (tmp_path / "cut").mkdir()
    results: dict[str, replay.Replayed] = {}
    first = BudgetStrategy(limits, seed=5)
    first.open(tmp_path / "cut")
    got = _walk(space, first, results, stop_after=cut)  # killed: route `cut` asked, not measured
    journal = tmp_path / "cut" / STUDY_NAME
    with journal.open("ab") as f:
        f.write(b'{"op_code": 5, "worker_id": "x", "trial_id"')  # a line a kill cut short
    again = BudgetStrategy(limits, seed=5)
    again.open(tmp_path / "cut")
    got = got[:-1] + _walk(space, again, results)
    assert got == reference


def test_a_search_killed_among_its_moves_and_repairs_resumes_them(tmp_path: Path) -> None:
    """Killed twice after the structured start (51 routes on the 30-knob landscape), among the
    moves of the best route, the repairs and the model's proposals: the same proposals."""
    space = replay.landscape_space(30, 0.01, 0)
    limits = Limits(max_builds=120)
    (tmp_path / "whole").mkdir()
    whole = BudgetStrategy(limits, seed=3)
    whole.open(tmp_path / "whole")
    reference = _walk(space, whole, {})
    (tmp_path / "cut").mkdir()
    results: dict[str, replay.Replayed] = {}
    got: list[str] = []
    for cut in (60, 35, None):
        again = BudgetStrategy(limits, seed=3)
        again.open(tmp_path / "cut")
        part = _walk(space, again, results, stop_after=cut)
        got = got[:-1] + part  # the route asked but never measured comes first again
    assert got == reference and len(reference) == 119  # the baseline is measured beforehand


def test_an_unreadable_journal_is_one_clear_error(tmp_path: Path) -> None:
    from dossier.errors import TuneError

    space = replay.landscape_space(6, 0.01, 0)
    (tmp_path / STUDY_NAME).write_text('{"op_code": 0}\n{"op_code": 4, "trial_id": "x"}\n')
    s = BudgetStrategy(Limits(max_builds=5))
    s.open(tmp_path)
    with pytest.raises(TuneError, match="study journal .* is refused"):
        _walk(space, s, {})


def test_dry_run_says_what_the_budget_buys(sample) -> None:
    from conftest import cli

    path, _ = sample("convnet")
    res = cli("tune", path, "--strategy", "budget", "--max-builds", "8", "--dry-run")
    assert res.exit_code == 0, res.stderr
    assert "the budget buys 8 builds" in res.stdout
    assert "structured start: 5 of 5 routes" in res.stdout and "up to 3 proposals" in res.stdout
    assert "each knob's values tried from the best route so far" in res.stdout  # 8 < 2 x 5
    res = cli("tune", path, "--strategy", "budget", "--max-builds", "10", "--dry-run")
    assert "structured start: 5 of 5 routes (the baseline and one-knob routes)" in res.stdout
    assert "(a first build)" in res.stdout
    res = cli("tune", path, "--strategy", "budget", "--dry-run")
    assert res.exit_code == 3 and "needs a budget" in res.stderr


def test_release_takes_the_budget_and_refuses_a_search_without_one(sample, tmp_path: Path) -> None:
    from conftest import cli

    path, _ = sample("convnet")
    path.write_text(path.read_text().replace('strategy = "full"', 'strategy = "budget"'))
    res = cli("release", path, "--out", tmp_path / "out")
    assert res.exit_code == 3 and "needs a budget" in res.stderr
    assert not (tmp_path / "out").exists()  # nothing half-written
    res = cli("release", path, "--out", tmp_path / "out", "--max-builds", "0")
    assert res.exit_code == 2 and "--max-builds" in res.stderr


def test_a_budgeted_search_runs_stops_and_explains_itself(sample, tmp_path: Path) -> None:
    from dossier.audit.explain import explain_search
    from dossier.tuner import tune

    _, spec = sample("convnet", backend="landscape", strategy="budget", max_builds=10,
                     selection="-k06=[v0|v1|v2] -k07=[v0|v1] -k02=[v0|v1]")
    res = tune(spec, tmp_path / "run")
    main = [t for t in res.cache.trials if t.role != "confirm"]
    assert len(main) == 10 and (tmp_path / "run" / STUDY_NAME).is_file()
    assert "search stopped: the budget of 10 builds is spent" in res.notes
    c = res.cache
    e = explain_search(c.header, c.trials, c.sessions, c.decision, run_dir=tmp_path / "run")
    b = e.search_budget
    assert b is not None and b.builds == 10 and b.start == 5 and b.max_builds == 10
    assert not b.ascent
    assert b.stopped == "the budget of 10 builds is spent"
    # a budget of 10 is not under twice the 5 routes of the start: the start varies the
    # baseline alone, one knob at a time (then what helped goes together, then proposals)
    assert [r.phase for r in b.routes][:5] == ["baseline", *["start"] * 4]
    assert {r.phase for r in b.routes[5:]} <= {"combination", "proposal"}
    base = Route.parse(main[0].route).as_dict()
    assert all(sum(v != base[k] for k, v in Route.parse(t.route).as_dict().items()) == 1
               for t in main[1:5])


def test_a_small_budget_starts_with_an_ascent_and_explain_says_so(sample, tmp_path: Path) -> None:
    """A budget under twice the structured start: each knob is tried from the route the ascent
    stands on, so what helped is combined within the start."""
    from dossier.audit.budget import lines
    from dossier.audit.explain import explain_search
    from dossier.strategies.spend import speedup
    from dossier.tuner import tune

    _, spec = sample("convnet", backend="landscape", strategy="budget", max_builds=6,
                     selection="-k06=[v0|v1|v2] -k07=[v0|v1] -k02=[v0|v1]")
    res = tune(spec, tmp_path / "run")
    main = [t for t in res.cache.trials if t.role != "confirm"]
    routes = [Route.parse(t.route).as_dict() for t in main]
    min_effect = res.cache.header.timing.min_effect

    def moved(here: Any, tried: Any) -> Any:
        """Where the ascent stands after one tried route (its rule, for one route)."""
        return tried if (speedup(tried) or 0) >= (speedup(here) or 0) * (1 + min_effect) else here

    assert len(main) == 6
    assert routes[1] == {**routes[0], "k02": "v1"}  # right to left, as fast
    here = Route.parse(moved(main[0], main[1]).route).as_dict()
    assert routes[2] == {**here, "k07": "v1"}
    here = Route.parse(moved(moved(main[0], main[1]), main[2]).route).as_dict()
    assert routes[3:5] == [{**here, "k06": "v1"}, {**here, "k06": "v2"}]
    c = res.cache
    e = explain_search(c.header, c.trials, c.sessions, c.decision, run_dir=tmp_path / "run")
    b = e.search_budget
    assert b is not None and b.start == 5 and b.ascent
    assert [r.phase for r in b.routes] == ["baseline", *["start"] * 4, "proposal"]
    assert "5 in the structured start (an ascent" in "\n".join(lines(b))


def test_the_ascent_moves_to_what_helped_by_the_minimum_effect() -> None:
    from dossier.errors import SelectionError
    from dossier.routes import Selection
    from dossier.strategies.budget import ascends, ascent, start_size

    recorded = Selection.recorded("-p=on -a=[x|y] -b=[x|y|z]")
    assert recorded.text() == "-p=on -a=[x|y] -b=[x|y|z]" and recorded.items[0].pinned
    with pytest.raises(SelectionError, match="not -knob=value"):
        Selection.recorded("-a=[x|y] b=x")
    varied = recorded.varied
    base = Route.of({"a": "x", "b": "x"})
    assert start_size(base, varied) == 4 and ascends(4, 7) and not ascends(4, 8)
    got: dict[str, _T] = {}

    def put(a: str, b: str, r: float | Outcome) -> None:
        route = Route.of({"a": a, "b": b}).text()
        got[route] = _ok(route, r) if isinstance(r, float) else _T(route, r, None)

    def nxt(min_effect: float = 0.02) -> str | None:
        step = ascent(base, varied, got, min_effect)
        return step.text() if step is not None else None

    assert nxt() == base.text()
    put("x", "x", 1.0)
    assert nxt() == "-a=x -b=y"  # right to left, as fast
    put("x", "y", Outcome.BUILD_FAILED)
    assert nxt() == "-a=x -b=z"
    put("x", "z", 1.3)
    assert nxt() == "-a=y -b=z"  # from the fastest admissible, not from the baseline
    put("y", "z", 1.1)
    assert nxt() is None  # every knob had its turn
    assert nxt(min_effect=0.5) == "-a=y -b=x"  # 1.3x is under the minimum effect: stays put


@pytest.mark.bench
def test_replay_bench_smoke(tmp_path: Path) -> None:
    import json
    import subprocess

    out = tmp_path / "replay.json"
    subprocess.run([sys.executable, str(REPO / "bench" / "replay.py"), "--landscape", "10",
                    "--smoke", "--out", str(out)], check=True, capture_output=True, cwd=REPO)
    data = json.loads(out.read_text())
    assert data["provenance"]["command"].startswith("python bench/replay.py --landscape 10")
    assert set(data["strategies"]) == {"fast", "mixed", "random", "budget"}
    for r in data["strategies"].values():
        assert all(len(c) <= 30 for c in r["curves"]) and len(r["curves"]) == 2
        assert all(0 < x <= 1.0 + 1e-9 for c in r["curves"] for x in c)
    assert "| budget |" in out.with_suffix(".md").read_text()


def _replayed_order(cache: TuningCache, limits: Limits, seed: int) -> list[str]:
    """The routes a fresh, uninterrupted budget search with ``seed`` proposes when each route
    measures what the recorded search measured, in the order it proposes them."""
    from dossier.knobs import KnobDatabase
    from dossier.routes import Selection

    db = KnobDatabase.model_validate_json((cache.path.parent / "knobs.json").read_text())
    selection = Selection.parse(cache.header.spec.tune.selection, db)
    recorded = {t.route: t for t in cache.trials if t.role != "confirm"}
    base = selection.baseline(db).text()
    results = {base: recorded[base]}
    strategy = BudgetStrategy(limits, seed)
    strategy.open(None)
    for route in strategy.routes(selection, db, results):  # type: ignore[arg-type]
        results[route.text()] = recorded[route.text()]
    return list(results)


@pytest.mark.slow
def test_kill_9_then_continue_makes_the_proposals_of_an_uninterrupted_search(
        samples_dir: Path, tmp_path: Path) -> None:
    """A real SIGKILL mid-proposals, then --continue: the trials recorded are, in order, those an
    uninterrupted search with the same seed proposes given the same measurements."""
    import os
    import shutil
    import signal
    import subprocess
    import time

    from conftest import subprocess_env, write_tiny_timing

    from dossier.run_folder import CACHE_NAME
    from dossier.tuner import continue_tune

    work = tmp_path / "convnet"
    shutil.copytree(samples_dir / "convnet", work)
    spec = work / "release.toml"
    spec.write_text(spec.read_text().replace('backend = "onnxruntime"', 'backend = "landscape"'))
    write_tiny_timing(spec)
    run = tmp_path / "run"
    proc = subprocess.Popen(
        [sys.executable, "-m", "dossier_cli.main", "tune", str(spec), "--out",
         str(run), "--quiet", "--strategy", "budget", "--max-builds",
         "10", "--selection", "-k06=[v0|v1|v2] -k07=[v0|v1] -k02=[v0|v1]"],
        env=subprocess_env(), start_new_session=True, stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL)
    cache = run / CACHE_NAME
    deadline = time.time() + 240
    while time.time() < deadline:  # the start (5) and the combination (1), then a proposal
        if cache.exists() and cache.read_text().count('"kind":"trial"') >= 7:
            break
        time.sleep(0.05)
    else:
        proc.kill()
        pytest.fail("the search did not get going")
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    res = continue_tune(run)
    main = [t.route for t in res.cache.trials if t.role != "confirm"]
    assert len(main) == len(set(main)) == 10
    assert main == _replayed_order(res.cache, Limits(max_builds=10), seed=0)
    assert "search stopped: the budget of 10 builds is spent" in res.notes


def test_the_replay_takes_a_recorded_full_search(rel, tmp_path: Path) -> None:
    """bench/replay.py --cache: every strategy walks the routes the convnet release's ``full``
    search measured; each reading is the recorded one, the optimum the best recorded."""
    cache = rel["convnet"].run / "tuning-cache.jsonl"
    space = replay.cache_space(cache)
    recorded = [t for t in TuningCache.open(cache).trials if t.role != "confirm"]
    n = len(recorded)
    assert space.notes["routes"] == n >= 2
    assert space.optimum == max(1.0, *(t.comparison.speedup for t in recorded
                                       if t.admissible and t.role != "baseline" and t.comparison))
    for name in replay.STRATEGIES:
        curve = replay.walk(space, name, n, seed=1)
        assert 0 < curve[-1] <= 1.0 and len(curve) <= n
    # a walk over every route reaches the best recorded one: the curve ends at 1.0
    whole = replay.walk(space, "random", n, seed=0)
    assert len(whole) == n and whole[-1] == pytest.approx(1.0)
