"""The independent re-measurement: fresh processes per engine, end to end on the convnet sample;
the tuner's confirmation records; verify --rebench judging by the speedup."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import test_bundle_helpers as h

from dossier import replicate, timing
from dossier.backends import get_backend
from dossier.decision import decide
from dossier.errors import TuneError
from dossier.routes import Route
from dossier.timing import TimingSettings, compare
from dossier.trial import Comparison, TimingSummary
from dossier.tuner import Tuner, prepare
from dossier.validation import load_validation_set
from dossier.verify import judge_speedup

FAST = "-graph_optimization_level=all"
SLOW = "-graph_optimization_level=disable_all"  # no Conv+BN fusion, no NCHWc: several x slower
SETTINGS = TimingSettings(confirm_rounds=6, confirm_warmup=3, confirm_runs=20,
                          confirm_block_s=0.1, warmup_max_s=0.3, warmup_window=3)


@pytest.fixture(scope="module")
def engines(samples_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    out = tmp_path_factory.mktemp("engines")
    backend = get_backend("onnxruntime")
    paths = {}
    for route in (FAST, SLOW):
        paths[route] = out / f"{len(paths)}.ort"
        backend.build(samples_dir / "convnet" / "model.onnx", Route.parse(route), paths[route])
    return paths


def test_fresh_processes_per_engine_find_a_known_slowdown(engines: dict[str, Path],
                                                          samples_dir: Path) -> None:
    m = replicate.measure("onnxruntime", [(engines[FAST], FAST), (engines[FAST], FAST),
                                          (engines[SLOW], SLOW)],
                          samples_dir / "convnet" / "validation", SETTINGS)
    assert [len(r) for r in m.rounds] == [6, 6, 6] and len(m.warmup_runs) == 3
    assert all(10 <= len(block) <= 20 for r in m.rounds for block in r)
    slow = compare(m.rounds[0], m.rounds[2], SETTINGS, procedure="independent")
    assert slow.slower and slow.speedup_ci_high < 0.9 and slow.rounds == 6
    assert slow.p_value == pytest.approx(2 / 2 ** 6)  # every round agrees: the smallest p
    aa = compare(m.rounds[0], m.rounds[1], SETTINGS, procedure="independent")
    assert aa.rounds == 6 and aa.procedure == "independent"  # recorded; its level: test_timing


def test_process_generations_split_the_rounds_and_start_new_processes(
        engines: dict[str, Path], samples_dir: Path, tmp_path: Path) -> None:
    settings = SETTINGS.model_copy(update={"confirm_processes": 3, "confirm_rounds": 7})
    m = replicate.measure("onnxruntime", [(engines[FAST], FAST), (engines[SLOW], SLOW)],
                          samples_dir / "convnet" / "validation", settings, work=tmp_path / "w")
    assert [len(r) for r in m.rounds] == [7, 7]
    c = compare(m.rounds[0], m.rounds[1], settings, procedure="independent")
    # each generation reads the slow engine slower on its own; the interval, which also covers
    # a new generation's reading (t with 2 degrees of freedom), may be too wide to call it
    assert c.generation_speedups is not None and len(c.generation_speedups) == 3
    assert all(g < 0.9 for g in c.generation_speedups) and c.speedup < 0.9
    # one request per process: two engines in each of three generations
    requests = sorted(p.name for p in (tmp_path / "w").glob("engine-*.json"))
    assert requests == ["engine-0-gen1.json", "engine-0-gen2.json", "engine-0.json",
                        "engine-1-gen1.json", "engine-1-gen2.json", "engine-1.json"]


def test_generations_are_even_consecutive_spans() -> None:
    assert timing.generations(12, 1) == [range(0, 12)]
    assert timing.generations(12, 3) == [range(0, 4), range(4, 8), range(8, 12)]
    assert timing.generations(7, 3) == [range(0, 3), range(3, 5), range(5, 7)]
    assert timing.generations(2, 5) == [range(0, 1), range(1, 2)]
    problems = TimingSettings(confirm_rounds=4, confirm_processes=5).problems()
    assert any("confirm_processes=5 is more than" in p for p in problems)
    assert not TimingSettings(confirm_processes=12).problems()


def test_a_process_that_cannot_load_its_engine_is_a_clear_error(tmp_path: Path,
                                                                samples_dir: Path) -> None:
    bad = tmp_path / "bad.ort"
    bad.write_bytes(b"not an engine")
    with pytest.raises(TuneError, match="engine-0"):
        replicate.measure("onnxruntime", [(bad, FAST)], samples_dir / "convnet" / "validation",
                          SETTINGS, timeout_s=60)


def test_tuner_confirmation_records_the_independent_readings(sample, tmp_path: Path) -> None:
    _, spec = sample("convnet", strategy="full", selection="-graph_optimization_level=[all|disable_all]")
    spec = spec.model_copy(update={"timing": spec.timing.model_copy(update={
        "confirm_rounds": 6, "confirm_runs": 10, "confirm_block_s": 0.05,
        "confirm_processes": 2})})
    from dossier.cache import TuningCache
    from dossier.tuner import CACHE_NAME, _header

    p = prepare(spec)
    run = tmp_path / "run"
    run.mkdir()
    cache = TuningCache.create(run / CACHE_NAME, _header(p, None, [], None))
    tuner = Tuner(p, run, cache)
    tuner.run_trial(p.baseline, "baseline")
    slow = tuner.run_trial(Route.parse(SLOW, p.db), "search")
    tuner.confirm([slow])  # re-measure it as if it had screened faster
    confirms = [t for t in cache.trials if t.role == "confirm"]
    assert [t.route for t in confirms] == [FAST, SLOW]  # the confirmation's A/A, then the route
    for t in confirms:
        c = t.comparison
        assert c is not None and c.procedure == "independent" and c.rounds == 6
        assert t.sample_rounds is not None and len(t.sample_rounds) == len(t.samples_ms or [])
        assert max(t.sample_rounds) == 5
    # two generations: the A/A's interval is its generations' mean (the bias a gain must
    # clear), the candidate's also covers a new generation's reading
    assert [t.comparison.generation_interval for t in confirms] == ["mean", "prediction"]  # type: ignore[union-attr]
    assert all(len(t.comparison.generation_speedups or []) == 2 for t in confirms)  # type: ignore[union-attr]
    assert confirms[1].comparison.speedup < 0.9  # type: ignore[union-attr]
    d = decide(cache.trials, p.spec.timing)
    assert not d.gain and d.confirm_aa is not None and d.confirm_aa.procedure == "independent"


def _comparison(x: float, lo: float, hi: float) -> Comparison:
    t = TimingSummary(n=1, median_ms=1, ci_low_ms=1, ci_high_ms=1, mean_ms=1, p10_ms=1,
                      p90_ms=1, warmup_runs=0)
    return Comparison(baseline=t, speedup=x, speedup_ci_low=lo, speedup_ci_high=hi,
                      p_value=0.01, significant=True, faster=True, slower=False, rounds=12)


def test_rebench_judges_the_speedup_against_the_recorded_interval() -> None:
    recorded = (1.08, 1.05, 1.11)
    assert judge_speedup(_comparison(1.07, 1.04, 1.10), *recorded) == []
    fell = judge_speedup(_comparison(1.02, 1.01, 1.04), *recorded)
    assert fell and "fell to 1.020x [1.010, 1.040], below the recorded 1.080x" in fell[0]
    lost = judge_speedup(_comparison(1.04, 0.99, 1.06), *recorded)
    assert lost and "no longer excludes 1.0" in lost[0]
    assert judge_speedup(None, *recorded) == []  # the baseline ships: nothing to judge


@pytest.fixture(scope="module")
def rel(tmp_path_factory: pytest.TempPathFactory, samples_dir: Path) -> dict[str, h.Released]:
    return h.released(tmp_path_factory.mktemp("bundle-session"), samples_dir)


def test_inspect_shows_the_aa_reading_and_a_load_snippet_that_works(
        rel: dict[str, h.Released]) -> None:
    r = rel["convnet"]
    text = h.cli("inspect", r.bundle).stdout
    assert "A/A check" in text and "rounds, screening)" in text
    assert f"load with    dossier.load({str(r.bundle)!r})" in text
    assert "raw loader   onnxruntime.InferenceSession('engine/convnet.ort', so" in text
    o = json.loads(h.cli("inspect", r.bundle, "--json").stdout)
    assert o["aa"]["rounds"] == h.SMALL_TIMING["rounds"] and o["aa"]["trial_index"] == 0
    assert o["load"]["options"] == {"graph_optimization_level": "ORT_DISABLE_ALL"}
    assert "force_spinning_stop" not in o["load"]["snippet"]
    # the snippet loads the shipped engine; it reproduces the float64 reference outputs
    namespace: dict = {"ENGINE": str(r.bundle / o["winner"]["engine"])}
    exec(o["load"]["snippet"], namespace)  # noqa: S102 - the bundle's own snippet, under test
    session = namespace["session"]
    for pair in load_validation_set(r.bundle / "validation").pairs:
        (got,) = session.run(None, dict(pair.inputs))
        assert float(np.max(np.abs(got - pair.references["logits"]))) < o["threshold"]


def test_production_load_names_only_what_differs_from_the_defaults() -> None:
    backend = get_backend("onnxruntime")
    db = backend.knob_database()
    plain = backend.production_load(Route.parse(FAST, db), db)
    assert plain.options == {"graph_optimization_level": "ORT_DISABLE_ALL"}
    tuned = backend.production_load(
        Route.parse("-intra_op_num_threads=1 -prepacking=off -execution_mode=parallel", db), db)
    assert tuned.options == {"graph_optimization_level": "ORT_DISABLE_ALL",
                             "intra_op_num_threads": "1", "session.disable_prepacking": "1",
                             "execution_mode": "ORT_PARALLEL"}
    assert "so.intra_op_num_threads = 1" in tuned.snippet
    assert "so.add_session_config_entry('session.disable_prepacking', '1')" in tuned.snippet
    assert "so.execution_mode = ort.ExecutionMode.ORT_PARALLEL" in tuned.snippet
    for name in ("torch-inductor", "tensorrt"):  # without their libraries: text only
        other = get_backend(name)
        other.configure({}, [])
        assert "ENGINE" in other.production_load(Route.parse(""), db).call


def test_production_load_of_a_cuda_graph_route_says_how_to_replay_it(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    torch = pytest.importorskip("torch")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # the knob database of a GPU host
    backend = get_backend("torch-inductor")
    db = backend.knob_database()
    graph = backend.production_load(Route.parse("-device=cuda -cuda_graph=on", db), db)
    assert "run_single_threaded=True" in graph.call and graph.options == {
        "run_single_threaded": "True"}
    assert "torch.cuda.graph(graph)" in graph.snippet and "graph.replay()" in graph.snippet
    compile(graph.snippet, "snippet", "exec")  # the lines a user copies are valid Python
    plain = backend.production_load(Route.parse("-device=cuda -cuda_graph=off", db), db)
    assert "run_single_threaded" not in plain.call and "graph" not in plain.snippet
