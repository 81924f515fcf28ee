"""The serving knob (ONNX Runtime's ``serving_sessions``) and the sessions a bundle serves with:
a knob like any other (database, route, load recipe), loaded by :func:`load_sessions`, and
LoadGen serving a verified bundle from its sessions."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from dossier.backends import get_backend
from dossier.errors import BundleError
from dossier.knobs import KnobPhase
from dossier.routes import Route
from dossier.scenario import SESSIONS_KNOB, ScenarioSection
from dossier.scenarios.child import ScenarioRequest
from dossier.scenarios.models import RunSettings
from dossier.scenarios.pool import load_sessions, sessions_of
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


@pytest.mark.parametrize("value", ["0", "257", "-1", "x" * 100, "1e3"])
def test_a_crafted_session_count_is_refused(value: str) -> None:
    with pytest.raises(BundleError, match=f"-{SESSIONS_KNOB}="):
        sessions_of(f"-{SESSIONS_KNOB}={value}")


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
