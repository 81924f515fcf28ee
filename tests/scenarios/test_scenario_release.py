"""A release under a server scenario, end to end on the conv-net sample with tiny settings:
the single-stream decision picks the engine, its serving configurations (``serving_sessions``)
compete under LoadGen, and the scenario's decision and LoadGen's logs are in the bundle like
every other file. Which configuration ships is not asserted (the host is busy); that the
records agree with one another is."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import _bundles as h
import pytest
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

def test_an_altered_loadgen_log_fails_integrity(released: tuple[Path, Path], tmp_path: Path
                                                ) -> None:
    copy = h.copy_bundle(released[1], tmp_path / "copy")
    (copy / "scenario/logs/config-00/rep-00/mlperf_log_detail.txt").write_text("tampered\n")
    res = h.cli("verify", str(copy))
    assert res.exit_code == 6 and "mlperf_log_detail.txt: altered" in res.stderr


def test_run_scenario_replays_the_recorded_rate(released: tuple[Path, Path]) -> None:
    _, bundle = released
    res = h.cli("run", str(bundle), "--scenario")
    assert res.exit_code in (0, 11), res.stderr  # 11: the bound not met here (a busy host)
    (said,) = [x for x in res.stderr.splitlines() if "scenario server" in x]
    assert said.startswith("OK: " if res.exit_code == 0 else "FAIL: ")
    assert "p50 <= 2000 ms: at " in said and "(the lowest rate the release met in its 2 " \
        "repetitions)" in said
    assert "LoadGen's own result: " in said


def test_run_scenario_on_a_single_stream_bundle_says_so(bundle: Path, host: Path) -> None:
    res = h.cli("run", str(bundle), "--scenario", "--host-fingerprint", str(host))
    assert res.exit_code == 3
    assert "was released for single-stream: it records no server or offline scenario" \
        in res.stderr and "Traceback" not in res.stderr


def test_rebench_replays_the_search_and_judges_it(released: tuple[Path, Path]) -> None:
    from dossier.scenarios.replay import rebench_scenario

    _, bundle = released
    with open_bundle(bundle) as b:
        replayed = rebench_scenario(b)
        recorded = read_decision(b.file(DECISION))
    assert replayed is not None and 1 <= len(replayed.here.probes) <= 2
    assert replayed.recorded_qps == recorded.reading(recorded.shipped).metric_qps
    assert replayed.regression == (replayed.predict_low is not None
                                   and replayed.here.metric_qps < replayed.predict_low)
    assert "highest rate met here" in replayed.text


def test_rebench_clamps_a_recorded_scenario(released: tuple[Path, Path],
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    from dossier.scenarios import replay as replay_module

    _, bundle = released
    seen = {}
    monkeypatch.setattr(replay_module, "replay",
                        lambda source, decision, **kw: seen.setdefault("s", decision.scenario))
    with open_bundle(bundle) as b:
        real = read_decision(b.file(DECISION))
        greedy = real.model_copy(update={"scenario": real.scenario.model_copy(update={
            "duration_s": 3600.0, "run_timeout_s": 86400.0, "search_steps": 40})})
        monkeypatch.setattr(replay_module, "recorded", lambda _: greedy)
        replay_module.rebench_scenario(b)
    s = seen["s"]
    assert (s.duration_s, s.run_timeout_s, s.search_steps) == (30.0, 120.0, 8)


@pytest.mark.parametrize(("text", "said"), [
    (b"{", "not a scenario decision"),
    (b'{"scenario": {"kind": "server"}}', "not a scenario decision"),
    (b"[]", "not a scenario decision"),
])
def test_a_crafted_scenario_decision_is_refused(tmp_path: Path, text: bytes, said: str) -> None:
    from dossier.errors import BundleError

    path = tmp_path / "decision.json"
    path.write_bytes(text)
    with pytest.raises(BundleError, match=said) as info:
        read_decision(path)
    assert "\n" not in str(info.value) and info.value.exit_code == 6
    path.write_bytes(b" " * ((16 << 20) + 1))
    with pytest.raises(BundleError):
        read_decision(path)


def test_explain_draws_the_curve_with_the_bound_and_the_shipped_point(
        released: tuple[Path, Path]) -> None:
    _, bundle = released
    res = h.cli("explain", str(bundle))
    assert res.exit_code == 0, res.stderr
    out = res.stdout
    assert "Under the scenario (server: p50 <= 2000 ms)" in out
    assert "p50 latency (ms, log scale) against QPS completed; bound 2000 ms at p50 (-)" in out
    assert "(single-stream choice)" in out and "(ships)" in out
    assert ("the single-stream choice ships" in out) or ("the single-stream choice lost" in out)
    data = json.loads(h.cli("explain", str(bundle), "--json").stdout)
    assert data["scenario"]["bound_ms"] == 2000 and data["scenario"]["points"]
    assert {p["config"] for p in data["scenario"]["points"]} <= set(data["scenario"]["metric_qps"])


def test_the_html_report_has_the_curve(released: tuple[Path, Path], tmp_path: Path) -> None:
    pytest.importorskip("plotly", reason="the HTML report needs the [report] extra")
    _, bundle = released
    out = tmp_path / "report.html"
    res = h.cli("explain", str(bundle), "--html", str(out))
    assert res.exit_code == 0, res.stderr
    page = out.read_text()
    assert 'id="plot-scenario"' in page and "Latency against throughput" in page


def test_verify_rebench_replays_the_scenario(released: tuple[Path, Path]) -> None:
    _, bundle = released
    res = h.cli("verify", str(bundle), "--rebench", "--max-s", "120")
    assert res.exit_code in (0, 10), res.stderr  # 10: a regression here (a busy host)
    said = res.stdout + res.stderr
    assert "scenario server: p50 <= 2000 ms: highest rate met here" in said
    assert ("): holds" in said) != ("regression: scenario" in said)


def test_a_finished_scenario_stage_is_not_measured_again(released: tuple[Path, Path],
                                                         tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """A search resumed after its scenario stage finished (``decision.json`` written; killed
    before or after the record was appended) appends the scenario's record once, and runs no
    LoadGen."""
    import shutil

    from dossier.knobs import KnobDatabase
    from dossier.scenarios import release
    from dossier.scenarios.models import AA

    def no_loadgen(*_: object, **__: object) -> None:
        raise AssertionError("measured again")

    monkeypatch.setattr(release, "decide", no_loadgen)
    run_dir = tmp_path / "run"
    shutil.copytree(released[0], run_dir)
    recorded = read_decision(run_dir / DECISION)
    other = next(r.name for r in recorded.readings if r.name not in (recorded.baseline, AA))
    verdicts = [v.model_copy(update={"confirmed": True, "ratio": 1.5, "low": 1.2, "high": 1.8,
                                     "p_value": 0.001, "level": 0.05})
                if v.name == other else v for v in recorded.verdicts]
    forged = recorded.model_copy(update={"shipped": other, "verdicts": verdicts})
    (run_dir / DECISION).write_text(forged.model_dump_json())
    cache = TuningCache.open(run_dir / "tuning-cache.jsonl")
    first = next(r for r in cache.records if isinstance(r, DecisionRecord))
    db = KnobDatabase.model_validate_json((run_dir / "knobs.json").read_bytes())
    spec = cache.header.spec
    kept = [r for r in cache.records if isinstance(r, DecisionRecord)]
    for _ in range(2):
        now = release.after_search(cache, cache.decision or first, run_dir, db, spec.scenario,
                                   backend="onnxruntime", timing=spec.timing)
        assert now.shipped_route == forged.reading(other).route
        assert "served 1.5x [1.2, 1.8] the QPS of" in now.reason
    after = [r for r in TuningCache.open(run_dir / "tuning-cache.jsonl").records
             if isinstance(r, DecisionRecord)]
    assert len(after) == len(kept) + (kept[-1].shipped_route != now.shipped_route)
