"""The parent/child protocol: typed results, and limits the child sets on itself."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from pydantic import ValidationError

from dossier.jobs.child import run_child
from dossier.jobs.worker import RESULT, BuiltResult, FailedResult, JudgedResult, WorkerRequest
from dossier.measure.timing import TimingSettings


def _request(tmp: Path, **kw: object) -> WorkerRequest:
    return WorkerRequest(mode="validate", backend="onnxruntime", model="", metric="l2",
                         validation=str(tmp / "missing"), threshold=1.0, atol=0.0, rtol=0.0,
                         timing=TimingSettings(), timeout_s=120.0, baseline_route="", route="",
                         engine=str(tmp / "missing.ort"), result=str(tmp / "r.json"),
                         stage=str(tmp / "stage"), **kw)  # type: ignore[arg-type]


def test_results_are_told_apart_by_outcome() -> None:
    built = RESULT.validate_python({"outcome": "built", "build_s": 2.5})
    assert isinstance(built, BuiltResult) and built.build_s == 2.5
    judged = RESULT.validate_python({"outcome": "rejected", "reason": "pair p0: loss 2"})
    assert isinstance(judged, JudgedResult) and judged.samples_ms is None
    failed = RESULT.validate_python({"outcome": "build_failed", "reason": "no"})
    assert isinstance(failed, FailedResult)
    with pytest.raises(ValidationError):
        RESULT.validate_python({"outcome": "ok-ish"})
    with pytest.raises(ValidationError):  # a build result without its time
        RESULT.validate_python({"outcome": "built"})


def test_a_child_whose_parent_is_gone_leaves_at_once(tmp_path: Path) -> None:
    req = _request(tmp_path, parent_pid=1)  # not our parent: the parent "died" before prctl
    path = tmp_path / "req.json"
    path.write_text(req.model_dump_json())
    run = subprocess.run([sys.executable, "-m", "dossier.jobs.worker", str(path)], capture_output=True,
                         timeout=120, check=False)
    assert run.returncode == 1 and not (tmp_path / "r.json").exists()


def test_a_failing_child_reports_a_typed_failure(tmp_path: Path) -> None:
    result = run_child(_request(tmp_path, memory_mb=4096), tmp_path, "validate")
    assert isinstance(result, FailedResult) and result.outcome == "runtime_error"
    assert "during setup" in result.reason or "during load" in result.reason
    assert "startup" in result.phases_s


def test_a_child_is_paused_only_once_it_follows_its_parent(tmp_path: Path) -> None:
    """Paused straight after its start, a child was stopped before it set its parent-death
    signal; a parent killed then left it stopped for ever (seen after kill -9 of a search
    whose builds were paused). pause() lets it reach its first stage first."""
    import os
    import signal

    from dossier.jobs.child import Child

    child = Child(_request(tmp_path), tmp_path, "paused")
    try:
        child.pause()
        assert child._stage() != "start"  # the child's guard (prctl) had run
        import time

        def state() -> str:
            with open(f"/proc/{child.proc.pid}/stat") as f:
                return f.read().split(") ", 1)[1][0]

        deadline = time.monotonic() + 5  # SIGSTOP lands asynchronously
        while state() != "T" and time.monotonic() < deadline:
            time.sleep(0.01)
        assert state() == "T"  # and it is stopped
    finally:
        child.resume()
        os.killpg(child.proc.pid, signal.SIGKILL)
        child.proc.wait()


def _measure_request(tmp: Path, samples_dir: Path, engine: Path, timeout_s: float = 60.0,
                     **kw: object) -> WorkerRequest:
    timing = TimingSettings(confirm_rounds=2, confirm_warmup=1, confirm_runs=5,
                            confirm_block_s=0.01, warmup_max_s=0.1, warmup_window=2)
    return WorkerRequest(mode="measure", backend="onnxruntime", model="",
                         validation=str(samples_dir / "convnet" / "validation"), threshold=1.0,
                         timing=timing, timeout_s=timeout_s, baseline_route="", result="",
                         stage="", **kw)  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def convnet_engine(samples_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    from dossier.backends import get_backend
    from dossier.routes import Route

    out = tmp_path_factory.mktemp("engine") / "e.ort"
    get_backend("onnxruntime").build(samples_dir / "convnet" / "model.onnx", Route.parse(""), out)
    return out


def test_a_child_on_standby_imports_then_waits_for_its_final_request(
        tmp_path: Path, samples_dir: Path, convnet_engine: Path) -> None:
    """Started on standby, a measuring process imports its backend's runtime and then waits,
    having loaded nothing, however long; go() hands it the request it runs (other engines than
    its provisional one), and its time limit counts from then."""
    import time

    from dossier.jobs.child import Child
    from dossier.jobs.worker import MeasuredResult

    guess = _measure_request(tmp_path, samples_dir, convnet_engine, timeout_s=3.0,
                             engines=[(str(tmp_path / "not-there.ort"), "")])
    child = Child(guess, tmp_path, "m", standby=True)
    try:
        deadline = time.monotonic() + 60
        while child._stage() != "standby" and time.monotonic() < deadline:
            time.sleep(0.02)
        assert child._stage() == "standby" and child.proc.poll() is None
        time.sleep(3.5)  # longer than its limit: waiting does not count
        assert child.poll() is None and child.proc.poll() is None
        final = _measure_request(tmp_path, samples_dir, convnet_engine,
                                 engines=[(str(convnet_engine), "")] * 2, offset=1)
        child.go(final)
        assert child.req.timeout_s == child.timeout == 3.0  # the limit it started with
        result = child.wait()
    finally:
        child.kill()
    assert isinstance(result, MeasuredResult), result
    assert len(result.rounds) == 2 and all(len(r) == 2 for r in result.rounds)
    assert result.phases_s["standby"] >= 3.5 and "load" in result.phases_s
    assert {"warm", "time"} <= set(result.phases_s)


def test_a_child_on_standby_that_fails_to_start_says_why_once_its_turn_comes(
        tmp_path: Path, samples_dir: Path, convnet_engine: Path) -> None:
    from dossier.jobs.child import Child

    req = _measure_request(tmp_path, samples_dir, convnet_engine).model_copy(
        update={"backend": "no-such-backend", "engines": [(str(convnet_engine), "")] * 2})
    child = Child(req, tmp_path, "m", standby=True)
    child.proc.wait(timeout=60)  # it ended during its setup, before its turn
    child.go(req)  # the parent does not know yet: no error here
    result = child.wait()
    assert isinstance(result, FailedResult) and "during setup" in result.reason
    with pytest.raises(ValueError, match="not started on standby"):
        child.go(req)


def test_a_child_on_standby_leaves_when_it_is_not_needed(
        tmp_path: Path, samples_dir: Path, convnet_engine: Path) -> None:
    from dossier.jobs.child import Child

    req = _measure_request(tmp_path, samples_dir, convnet_engine,
                           engines=[(str(convnet_engine), "")] * 2)
    child = Child(req, tmp_path, "m", standby=True)
    assert child.proc.stdin is not None
    child.proc.stdin.close()  # end of input: the parent no longer needs it
    assert child.proc.wait(timeout=60) == 0 and not (tmp_path / "m.result.json").exists()


def test_a_measuring_process_waits_for_its_successors_imports(tmp_path: Path) -> None:
    """Before timing, a measuring process waits while the process on standby for the next turn
    is still in its setup (imports), and no longer once it is past it or has ended."""
    import threading
    import time

    from dossier.jobs.worker import _wait_for_standby

    stage = tmp_path / "next.stage"
    stage.write_text("setup")
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        timer = threading.Timer(0.4, lambda: stage.write_text("standby"))
        timer.start()
        t0 = time.monotonic()
        _wait_for_standby(str(stage), sleeper.pid)
        assert 0.35 < time.monotonic() - t0 < 5
        stage.write_text("setup")
        sleeper.kill()
        sleeper.wait()  # reaped: its pid is gone
        t0 = time.monotonic()
        _wait_for_standby(str(stage), sleeper.pid)
        assert time.monotonic() - t0 < 1
        ended = subprocess.Popen(["true"])
        time.sleep(0.3)  # ended, not yet reaped: a zombie
        t0 = time.monotonic()
        _wait_for_standby(str(stage), ended.pid)
        assert time.monotonic() - t0 < 1
        ended.wait()
    finally:
        sleeper.kill()
        sleeper.wait()
