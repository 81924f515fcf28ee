"""The LoadGen machinery of the server and offline scenarios: its logs read back as untrusted
input, the bounded search for the highest rate meeting a bound (on a fake probe: no clock), and
short LoadGen runs on a synthetic engine whose figures are not asserted (the host is busy)."""

from __future__ import annotations

import importlib.util
import json
import os
import time
from pathlib import Path

import pytest

from dossier.errors import ExitCode, SpecError
from dossier.scenario import ScenarioSection
from dossier.scenarios.child import ChildError, RunFailed, ScenarioRequest, measure
from dossier.scenarios.logs import LINES_MAX, LoadGenRun, LogError, parse_detail, read_run
from dossier.scenarios.models import Probe, RunSettings
from dossier.scenarios.search import PROBES, highest_rate, read_probes, serve_configuration

needs_loadgen = pytest.mark.skipif(importlib.util.find_spec("mlperf_loadgen") is None,
                                   reason="mlcommons-loadgen is not installed (the [scenario] "
                                          "extra)")


def _event(key: str, value: object) -> str:
    return ":::MLLOG " + json.dumps({"key": key, "value": value, "time_ms": 1.0,
                                     "namespace": "mlperf::logging"})


def _detail(**over: object) -> str:
    events: dict[str, object] = {
        "loadgen_version": "6.0.17 @ x", "effective_scenario": "Server",
        "effective_target_qps": 200, "effective_target_latency_ns": 5_000_000,
        "effective_target_latency_percentile": 0.99, "effective_min_duration_ms": 1000,
        "result_validity": "VALID", "result_query_count": 1000,
        "result_overlatency_query_count": 10, "result_scheduled_samples_per_sec": 199.0,
        "result_completed_samples_per_sec": 198.5, "result_min_latency_ns": 100,
        "result_mean_latency_ns": 2_000_000, "result_max_latency_ns": 9_000_000,
        "result_99.00_percentile_latency_ns": 4_900_000, "num_errors": 0}
    events.update(over)
    return "\n".join(["junk line LoadGen would not write"]
                     + [_event(k, v) for k, v in events.items() if v is not None]) + "\n"


def test_a_detail_log_reads_back() -> None:
    run = parse_detail(_detail())
    assert run.scenario == "Server" and run.loadgen_result == "VALID"
    assert (run.target_percentile, run.query_count, run.overlatency_count) == (99.0, 1000, 10)
    assert run.latency_ms("99.00") == 4.9 and run.latency_ms("90.00") is None
    assert run.meets(5_000_000, 99.0)  # 10 of 1000 late: 1%, allowed at p99
    assert not run.meets(5_000_000, 99.5)
    assert not run.meets(4_000_000, 99.0)  # the run was judged against another bound


def test_loadgen_validity_is_not_dossiers_reading() -> None:
    # LoadGen says INVALID (its minimum duration, say) while the bound held: kept as LoadGen's
    run = parse_detail(_detail(result_validity="INVALID",
                               result_invalid_reason="Reduce target QPS"))
    assert run.loadgen_result == "INVALID" and run.meets(5_000_000, 99.0)
    late = parse_detail(_detail(result_overlatency_query_count=11))
    assert late.loadgen_result == "VALID" and not late.meets(5_000_000, 99.0)
    backlog = parse_detail(_detail(result_completed_samples_per_sec=150.0))
    assert not backlog.meets(5_000_000, 99.0)  # completions fell behind the schedule
    assert not parse_detail(_detail(num_errors=1)).meets(5_000_000, 99.0)


@pytest.mark.parametrize(("text", "said"), [
    (_detail(result_validity=None), "no result"),
    (_detail(result_query_count="1000"), "result_query_count is not a finite number"),
    (_detail(result_query_count=True), "not a finite number"),
    (_detail().replace('"value": 198.5', '"value": NaN'), "not a finite number"),
    (_detail(result_mean_latency_ns=-5), "out of range"),
    (_detail(result_validity="PASSED"), "loadgen_result"),
    (_detail(effective_scenario="Bogus"), "scenario"),
    (_detail(result_validity=["VALID"]), "is not text"),
    (_detail() + ":::MLLOG {not json\n", "is not JSON"),
    (_detail() + ":::MLLOG [1, 2]\n", "not a LoadGen event"),
    (_detail() + ":::MLLOG " + "[" * 100_000 + "\n", "longer than"),
    (_detail() + ":::MLLOG " + "[" * 5000 + "\n", "is not JSON"),
    ("\n" * (LINES_MAX + 1), "more than"),
])
def test_a_crafted_detail_log_is_refused_in_one_line(text: str, said: str) -> None:
    with pytest.raises(LogError) as info:
        parse_detail(text)
    assert said in str(info.value) and "\n" not in str(info.value)
    assert info.value.exit_code == ExitCode.BUNDLE


def test_reading_a_log_folder_is_bounded(tmp_path: Path) -> None:
    with pytest.raises(LogError, match="wrote no detail log"):
        read_run(tmp_path)
    (tmp_path / "mlperf_log_detail.txt").write_bytes(b"x" * ((4 << 20) + 1))
    with pytest.raises(LogError, match="mlperf_log_detail.txt"):
        read_run(tmp_path)
    (tmp_path / "mlperf_log_detail.txt").unlink()
    (tmp_path / "elsewhere.txt").write_text(_detail())
    os.symlink(tmp_path / "elsewhere.txt", tmp_path / "mlperf_log_detail.txt")
    with pytest.raises(LogError, match="symbolic link"):
        read_run(tmp_path)


def _capacity(limit: float, calls: list[float]):  # a server that meets every rate up to limit
    def probe(qps: float) -> Probe:
        calls.append(qps)
        return Probe(qps=qps, met=qps <= limit)
    return probe


def test_the_search_brackets_the_highest_rate_met() -> None:
    calls: list[float] = []
    met, missed, probes = highest_rate(_capacity(730.0, calls), 100.0, 20)
    assert calls[:4] == [100.0, 200.0, 400.0, 800.0]  # doubling until a miss
    assert met <= 730.0 < missed and missed <= met * 1.05  # then bisection to 5%
    assert len(probes) == len(calls) < 20


def test_the_search_halves_from_a_rate_missed_and_stops_at_its_budget() -> None:
    calls: list[float] = []
    met, missed, _ = highest_rate(_capacity(30.0, calls), 1000.0, 4)
    assert calls == [1000.0, 500.0, 250.0, 125.0] and met == 0 and missed == 125.0
    nothing: list[float] = []
    assert highest_rate(_capacity(0.0, nothing), 10.0, 3)[0] == 0.0 and len(nothing) == 3


def test_the_search_resumes_from_finished_probes_without_running_them_again() -> None:
    calls: list[float] = []
    done = [Probe(qps=100.0, met=True), Probe(qps=200.0, met=False)]
    met, missed, probes = highest_rate(_capacity(160.0, calls), 100.0, 5, done)
    assert calls[0] == 150.0 and probes[:2] == done and len(probes) == 5


def test_a_probe_record_cut_by_a_kill_keeps_its_finished_lines(tmp_path: Path) -> None:
    record = tmp_path / PROBES
    lines = [Probe(qps=q, met=True).model_dump_json() for q in (1.0, 2.0)]
    record.write_text("\n".join(lines) + "\n" + lines[0][:17])
    assert [p.qps for p in read_probes(record)] == [1.0, 2.0]
    assert read_probes(tmp_path / "absent.jsonl") == []


def _synthetic(ms: float, sessions: int = 1) -> ScenarioRequest:
    return ScenarioRequest(source="synthetic", sleep_ms=ms, sessions=sessions,
                           settings=RunSettings(kind="server", qps=1, duration_s=1,
                                                max_duration_s=1))


@needs_loadgen
def test_a_stalled_run_is_stopped_at_its_limit(tmp_path: Path) -> None:
    started = time.monotonic()
    with pytest.raises(RunFailed, match="did not finish within 1.5 s; it was stopped") as info:
        measure(_synthetic(10_000), tmp_path, timeout_s=1.5)  # its warm-up alone takes 50 s
    assert time.monotonic() - started < 30 and info.value.exit_code == ExitCode.TUNE


@needs_loadgen
def test_an_engine_that_does_not_load_fails_the_run_with_its_reason(tmp_path: Path) -> None:
    req = ScenarioRequest(source="engine", path=str(tmp_path / "absent.ort"),
                          backend="onnxruntime", route="", validation=str(tmp_path),
                          settings=_synthetic(1).settings)
    with pytest.raises(ChildError) as info:
        measure(req, tmp_path / "w", timeout_s=120)
    assert "absent.ort" in str(info.value) and "\n" not in str(info.value)


@needs_loadgen
def test_a_short_server_search_on_a_synthetic_engine(tmp_path: Path) -> None:
    scenario = ScenarioSection(kind="server", latency_ms=200, percentile=90, duration_s=0.3,
                               min_queries=5, search_steps=2, run_timeout_s=120)
    result = serve_configuration(_synthetic(0.5, 2), scenario, tmp_path, start_qps=20)
    assert [p.qps for p in result.probes][:1] == [20.0] and len(result.probes) == 2
    for p in result.probes:  # LoadGen's own figures, as it reported them
        assert p.outcome == "ok" and isinstance(p.run, LoadGenRun)
        assert p.run.scenario == "Server" and p.run.target_latency_ns == 200_000_000
        assert p.met == p.run.meets(200_000_000, 90.0)
        assert (tmp_path / f"run-{result.probes.index(p):03d}" / "loadgen"
                / "mlperf_log_summary.txt").is_file()
        assert not list((tmp_path / f"run-{result.probes.index(p):03d}" / "loadgen")
                        .glob("mlperf_log_trace*"))
    assert result.metric_qps == max([p.qps for p in result.probes if p.met], default=0.0)
    # called again: the record answers, LoadGen does not run
    again = serve_configuration(_synthetic(10_000), scenario, tmp_path, start_qps=20)
    assert again.probes == result.probes


@needs_loadgen
def test_a_bound_below_one_inference_stops_with_exit_3(tmp_path: Path) -> None:
    scenario = ScenarioSection(kind="server", latency_ms=0.001, duration_s=0.3, min_queries=5)
    with pytest.raises(SpecError, match="below the engine's single-inference time"):
        serve_configuration(_synthetic(5), scenario, tmp_path, start_qps=5)


def test_a_short_runs_completion_rate_is_read_with_its_noise() -> None:
    # 17 queries at 1 QPS, none late, completions at 0.85 of the schedule: noise at that count
    short = parse_detail(_detail(result_query_count=17, result_overlatency_query_count=0,
                                 result_scheduled_samples_per_sec=1.0,
                                 result_completed_samples_per_sec=0.85))
    assert short.meets(5_000_000, 99.0)
    long = parse_detail(_detail(result_query_count=5000, result_overlatency_query_count=0,
                                result_scheduled_samples_per_sec=1.0,
                                result_completed_samples_per_sec=0.85))
    assert not long.meets(5_000_000, 99.0)  # a backlog over 5000 queries is one


def test_loadgen_may_run_long_enough_for_the_minimum_queries_at_a_low_rate() -> None:
    from dossier.scenarios.search import _max_duration

    s = ScenarioSection(kind="server", latency_ms=5, duration_s=3, min_queries=60,
                        run_timeout_s=120)
    assert _max_duration(s, 1000.0) == 9.0  # the duration's margin
    assert _max_duration(s, 1.0) == 90.0  # 1.5 x the 60 s 60 queries take
    assert _max_duration(s, 0.1) == 96.0  # within 0.8 of the run's time limit
