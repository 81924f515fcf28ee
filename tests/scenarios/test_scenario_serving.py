"""The serving knob (ONNX Runtime's ``serving_sessions``) and the sessions a bundle serves with:
a knob like any other (database, route, load recipe), loaded by :func:`load_sessions`, and
LoadGen serving a verified bundle from its sessions."""

from __future__ import annotations

import importlib.util
import time
from pathlib import Path

import numpy as np
import pytest

from dossier.backends import get_backend
from dossier.errors import BundleError
from dossier.knobs import KnobPhase
from dossier.routes import Route
from dossier.scenario import BATCH_KNOB, SESSIONS_KNOB, ScenarioSection
from dossier.scenarios.child import ScenarioRequest
from dossier.scenarios.models import RunSettings
from dossier.scenarios.pool import batch_of, load_sessions, sessions_of
from dossier.scenarios.search import serve_configuration


def test_the_sessions_knob_is_in_the_database() -> None:
    knob = get_backend("onnxruntime").knob_database().get(SESSIONS_KNOB)
    assert knob.values == ("1", "2", "4") and knob.default == "1"
    assert knob.phase is KnobPhase.LOAD and not knob.changes_numerics


def test_the_load_recipe_names_the_sessions() -> None:
    backend = get_backend("onnxruntime")
    db = backend.knob_database()
    served = backend.production_load(Route.parse(f"-{SESSIONS_KNOB}=4 -intra_op_num_threads=1"),
                                     db)
    assert served.options[SESSIONS_KNOB] == "4" and served.options["intra_op_num_threads"] == "1"
    assert "serve with 4 sessions in parallel" in served.snippet
    assert "sys.setswitchinterval(0.0002)" in served.snippet
    assert "4 sessions in parallel" in served.note
    one = backend.production_load(Route.parse("-intra_op_num_threads=1"), db)
    assert SESSIONS_KNOB not in one.options and "one session per process" in one.note


def test_the_sessions_knob_is_no_session_option() -> None:
    backend = get_backend("onnxruntime")
    so = backend._load_options(Route.parse(f"-{SESSIONS_KNOB}=2"))
    with pytest.raises(Exception, match=SESSIONS_KNOB):  # ORT: no such config entry
        so.get_session_config_entry(SESSIONS_KNOB)


@pytest.mark.parametrize(("route", "count"), [("", 1), (f"-{SESSIONS_KNOB}=4", 4),
                                              (f"-{SESSIONS_KNOB}=2 -a=b", 2)])
def test_sessions_of_a_route(route: str, count: int) -> None:
    assert sessions_of(route) == count
    assert batch_of(route) == 1


@pytest.mark.parametrize("value", ["0", "257", "-1", "x" * 100, "1e3"])
def test_a_crafted_session_count_is_refused(value: str) -> None:
    with pytest.raises(BundleError, match=f"-{SESSIONS_KNOB}="):
        sessions_of(f"-{SESSIONS_KNOB}={value}")


@pytest.mark.parametrize("value", ["0", "1025", "-4", "x" * 100, "8.0"])
def test_a_crafted_batch_is_refused(value: str) -> None:
    assert batch_of(f"-{BATCH_KNOB}=8 -{SESSIONS_KNOB}=2") == 8
    with pytest.raises(BundleError, match=f"-{BATCH_KNOB}="):
        batch_of(f"-{BATCH_KNOB}={value}")


def test_the_batch_knob_is_a_load_knob_named_in_the_recipe() -> None:
    backend = get_backend("onnxruntime")
    db = backend.knob_database()
    knob = db.get(BATCH_KNOB)
    assert knob.values == ("1", "4", "8") and knob.default == "1"
    assert knob.phase is KnobPhase.LOAD and not knob.changes_numerics
    served = backend.production_load(Route.parse(f"-{BATCH_KNOB}=8"), db)
    assert served.options[BATCH_KNOB] == "8"
    assert "answer up to 8 waiting queries with one call" in served.snippet
    so = backend._load_options(Route.parse(f"-{BATCH_KNOB}=4"))
    with pytest.raises(Exception, match=BATCH_KNOB):  # not a session option either
        so.get_session_config_entry(BATCH_KNOB)


def test_batched_feeds_concatenate_each_input_along_the_first_axis() -> None:
    from dossier.scenarios.worker import _batched

    a = {"x": np.ones((1, 3), np.float32), "m": np.zeros((2, 5), np.int64)}
    b = {"x": np.full((1, 3), 2, np.float32), "m": np.ones((2, 5), np.int64)}
    got = _batched([a, b, a])
    assert got["x"].shape == (3, 3) and got["m"].shape == (6, 5)
    assert got["x"][:, 0].tolist() == [1, 2, 1] and got["m"].dtype == np.int64


@pytest.mark.skipif(importlib.util.find_spec("mlperf_loadgen") is None,
                    reason="mlcommons-loadgen is not installed (the [scenario] extra)")
def test_the_driver_answers_waiting_queries_in_batches(tmp_path: Path) -> None:
    """Offline: every query is waiting at once, so calls take up to the batch and never more;
    every query is answered exactly once."""
    import threading

    from dossier.scenarios import driver

    sizes: list[int] = []
    seen: list[int] = []
    lock = threading.Lock()

    def answer(indices: list[int]) -> None:
        with lock:
            sizes.append(len(indices))
            seen.extend(indices)
        time.sleep(0.001)
    settings = RunSettings(kind="offline", qps=2000, duration_s=0.2, min_queries=200,
                           max_duration_s=2)
    driver.run([answer, answer], 16, settings, tmp_path / "lg", batch=4)
    assert len(seen) == sum(sizes) >= 200  # LoadGen's offline query holds every sample
    assert max(sizes) == 4 and all(1 <= n <= 4 for n in sizes)
    assert len(sizes) < len(seen)  # batched: fewer calls than queries
    one: list[int] = []
    driver.run([lambda idx: one.append(len(idx))], 16, settings, tmp_path / "lg1")
    assert set(one) == {1}


@pytest.mark.skipif(importlib.util.find_spec("mlperf_loadgen") is None,
                    reason="mlcommons-loadgen is not installed (the [scenario] extra)")
def test_loadgen_serves_a_verified_bundle_in_batches(bundle: Path, host: Path,
                                                     tmp_path: Path) -> None:
    """The golden convnet bundle's engine (a dynamic first axis) answers batches of 4 queries
    concatenated, through dossier.load, in the scenario's child process."""
    scenario = ScenarioSection(kind="offline", duration_s=0.3, min_queries=40)
    req = ScenarioRequest(source="bundle", path=str(bundle), batch=4,
                          verify={"host": str(host)},
                          settings=RunSettings(kind="offline", qps=1, duration_s=1,
                                               max_duration_s=1))
    result = serve_configuration(req, scenario, tmp_path, start_qps=200)
    (probe,) = result.probes
    assert probe.outcome == "ok" and probe.run is not None and not probe.run.errors
    assert probe.run.query_count >= 1 and result.metric_qps > 0


def test_a_bundle_without_the_knob_serves_one_session(bundle: Path, host: Path) -> None:
    engines = load_sessions(bundle, host=host)
    assert len(engines) == 1 and SESSIONS_KNOB not in engines[0].route


@pytest.mark.skipif(importlib.util.find_spec("mlperf_loadgen") is None,
                    reason="mlcommons-loadgen is not installed (the [scenario] extra)")
def test_loadgen_serves_a_verified_bundle_from_two_sessions(bundle: Path, host: Path,
                                                            tmp_path: Path) -> None:
    scenario = ScenarioSection(kind="offline", duration_s=0.3, min_queries=10)
    req = ScenarioRequest(source="bundle", path=str(bundle), sessions=2,
                          verify={"host": str(host)},
                          settings=RunSettings(kind="offline", qps=1, duration_s=1,
                                               max_duration_s=1))
    result = serve_configuration(req, scenario, tmp_path, start_qps=50)
    (probe,) = result.probes
    assert probe.outcome == "ok" and probe.run is not None and probe.run.scenario == "Offline"
    assert probe.run.query_count >= 1 and probe.single_ms is not None and probe.single_ms > 0
    assert result.metric_qps == probe.run.completed_qps


@pytest.mark.skipif(importlib.util.find_spec("mlperf_loadgen") is None,
                    reason="mlcommons-loadgen is not installed (the [scenario] extra)")
def test_the_worker_of_several_sessions_sets_the_switch_interval(tmp_path: Path) -> None:
    """What the recipe of several sessions tells a serving process, the scenario's worker does:
    one session leaves Python's switch interval alone, two set SWITCH_INTERVAL_S."""
    import sys

    from dossier.scenario import SWITCH_INTERVAL_S
    from dossier.scenarios import worker

    before = sys.getswitchinterval()
    settings = RunSettings(kind="offline", qps=500, duration_s=0.1, min_queries=10,
                           max_duration_s=1)
    try:
        for sessions, want in ((1, before), (2, SWITCH_INTERVAL_S)):
            folder = tmp_path / str(sessions)
            folder.mkdir()
            req = ScenarioRequest(source="synthetic", sleep_ms=0.1, sessions=sessions,
                                  settings=settings)
            (folder / "request.json").write_text(req.model_dump_json())
            assert worker.main([str(folder / "request.json")]) == 0
            assert sys.getswitchinterval() == pytest.approx(want)
    finally:
        sys.setswitchinterval(before)
