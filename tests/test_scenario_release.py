"""A release under a server scenario, end to end on the conv-net sample with tiny settings:
the single-stream decision picks the engine, its serving configurations (``serving_sessions``)
compete under LoadGen, and the scenario's decision and LoadGen's logs are in the bundle like
every other file. Which configuration ships is not asserted (the host is busy); that the
records agree with one another is."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
import test_bundle_helpers as h
from conftest import tiny_spec

from dossier.bundle import open_bundle
from dossier.bundle.writer import write_bundle
from dossier.cache import DecisionRecord, TuningCache
from dossier.scenarios.evidence import DECISION, read_decision
from dossier.spec import load_spec
from dossier.tuner import tune

pytestmark = pytest.mark.skipif(importlib.util.find_spec("mlperf_loadgen") is None,
                                reason="mlcommons-loadgen is not installed (the [scenario] "
                                       "extra)")

SCENARIO = """
[scenario]
kind = "server"
latency_ms = 2000
percentile = 50
duration_s = 0.2
min_queries = 5
search_steps = 2
processes = 2
"""


@pytest.fixture(scope="module")
def released(tmp_path_factory: pytest.TempPathFactory, samples_dir: Path) -> tuple[Path, Path]:
    import shutil

    root = tmp_path_factory.mktemp("scenario-release")
    folder = root / "convnet"
    shutil.copytree(samples_dir / "convnet", folder)
    spec = tiny_spec(folder, "served", tune='strategy = "full"\n'
                     'selection = "-serving_sessions=[1|2]"\n', extra=SCENARIO)
    result = tune(load_spec(spec), root / "run")
    return result.run_dir, write_bundle(result.run_dir, root / "out").path


def test_the_serving_configurations_competed_under_the_scenario(released: tuple[Path, Path]
                                                                ) -> None:
    run_dir, _ = released
    decision = read_decision(run_dir / DECISION)
    names = [r.name for r in decision.readings]
    assert len(names) == 3 and names[1] == "baseline (A/A)"
    assert {"-serving_sessions=1", "-serving_sessions=2"} <= {r.route for r in decision.readings}
    assert all(len(r.metric_qps) == 2 for r in decision.readings)  # two repetitions
    for reading in decision.readings:
        for result in reading.results:
            assert result.kind == "server" and 1 <= len(result.probes) <= 2
            for probe in result.probes:
                assert probe.run is None or probe.run.target_latency_ns == 2_000_000_000
    cache = TuningCache.open(run_dir / "tuning-cache.jsonl")
    decisions = [r for r in cache.records if isinstance(r, DecisionRecord)]
    shipped = next(r for r in decision.readings if r.name == decision.shipped)
    assert decisions[-1].shipped_route == shipped.route
    assert len(decisions) == (1 if decision.shipped == decision.baseline else 2)


def test_the_bundle_carries_the_scenario_and_loadgens_logs(released: tuple[Path, Path]) -> None:
    run_dir, bundle = released
    table = json.loads((bundle / "manifest.json").read_text())["files"]
    paths = {f["path"] for f in table}
    assert DECISION in paths
    logs = sorted(p for p in paths if p.startswith("scenario/logs/"))
    assert logs and all(p.endswith(("mlperf_log_detail.txt", "mlperf_log_summary.txt"))
                        for p in logs)
    assert not any("/runs/" in p for p in paths)  # the search's other runs are not kept
    with open_bundle(bundle) as b:
        decision = read_decision(b.file(DECISION))
        assert b.manifest.engines.shipped.route == next(
            r.route for r in decision.readings if r.name == decision.shipped)
    res = h.cli("verify", str(bundle), "--host-fingerprint", str(bundle / "fingerprint.json"))
    assert res.exit_code == 0, res.stderr
    (bundle / logs[0]).write_text("tampered\n")
    assert h.cli("verify", str(bundle)).exit_code == 6
