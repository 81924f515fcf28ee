"""The fork server: workers forked from one process that has done dossier's imports are this
process's children, run and report as started ones do, die, pause and time out as they do,
and a worker the server cannot fork starts afresh."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from test_child import _measure_request, _request, convnet_engine  # noqa: F401 - a fixture

from dossier.jobs import forkserver
from dossier.jobs.child import Child, worker_env
from dossier.jobs.worker import FailedResult, MeasuredResult


@pytest.fixture
def server(tmp_path: Path) -> Iterator[forkserver.ForkServer]:
    got = forkserver.start("onnxruntime", worker_env(), tmp_path / "forkserver.log")
    assert got is not None and got.ready()
    yield got
    forkserver.stop()


def test_a_forked_worker_is_this_processs_child_and_measures(
        server: forkserver.ForkServer, tmp_path: Path, samples_dir: Path,
        convnet_engine: Path) -> None:  # noqa: F811 - the fixture
    req = _measure_request(tmp_path, samples_dir, convnet_engine,
                           engines=[(str(convnet_engine), ""), (str(convnet_engine), "")])
    child = Child(req, tmp_path, "measure")
    assert isinstance(child.proc, forkserver.Forked)
    result = child.wait()
    assert isinstance(result, MeasuredResult), result
    assert len(result.rounds) == 2 and all(len(r) == 2 for r in result.rounds)
    assert child.proc.returncode == 0 and server.broken is None


def test_a_forked_worker_fails_and_is_killed_as_a_started_one(
        server: forkserver.ForkServer, tmp_path: Path) -> None:
    failed = Child(_request(tmp_path), tmp_path, "validate")
    assert isinstance(failed.proc, forkserver.Forked)
    result = failed.wait()  # no validation set: the worker's own failure, typed
    assert isinstance(result, FailedResult) and result.outcome == "runtime_error"
    slow = Child(_request(tmp_path).model_copy(update={"timeout_s": 0.01}), tmp_path, "slow")
    assert isinstance(slow.proc, forkserver.Forked)
    timed_out = slow.wait()
    assert isinstance(timed_out, FailedResult) and timed_out.outcome in ("timeout",
                                                                          "runtime_error")
    with pytest.raises(ProcessLookupError):  # reaped: gone, not a zombie of ours
        os.kill(slow.proc.pid, 0)


def test_a_forked_worker_pauses_with_its_process_group(
        server: forkserver.ForkServer, tmp_path: Path, samples_dir: Path,
        convnet_engine: Path) -> None:  # noqa: F811 - the fixture
    req = _measure_request(tmp_path, samples_dir, convnet_engine,
                           engines=[(str(convnet_engine), "")] * 2)
    child = Child(req, tmp_path, "paused")
    assert isinstance(child.proc, forkserver.Forked)
    try:
        child.pause()
        assert os.getpgid(child.proc.pid) == child.proc.pid  # its own group, as a started one
        with open(f"/proc/{child.proc.pid}/stat") as f:
            assert int(f.read().split(") ", 1)[1].split()[1]) == os.getpid()  # our child

        def state() -> str:
            with open(f"/proc/{child.proc.pid}/stat") as f:
                return f.read().split(") ", 1)[1][0]

        deadline = time.monotonic() + 5
        while state() != "T" and time.monotonic() < deadline:
            time.sleep(0.01)
        assert state() == "T"
    finally:
        child.resume()
        child.kill()
    assert child.proc.returncode == -signal.SIGKILL


def test_workers_the_server_cannot_fork_start_afresh(
        server: forkserver.ForkServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    limited = Child(_request(tmp_path, memory_mb=4096), tmp_path, "limited")
    assert not isinstance(limited.proc, forkserver.Forked)  # its limit would count the server
    limited.wait()
    other = Child(_request(tmp_path), tmp_path, "other-env", {"SOME_SETTING": "1"})
    assert not isinstance(other.proc, forkserver.Forked)  # an environment set at exec
    other.wait()
    monkeypatch.setenv("DOSSIER_SOMETHING_ELSE", "1")  # this process's own, since the start
    assert forkserver.serving("onnxruntime", worker_env()) is None
    monkeypatch.delenv("DOSSIER_SOMETHING_ELSE")
    os.killpg(server.proc.pid, signal.SIGKILL)  # the server dies
    server.proc.wait()
    after = Child(_request(tmp_path), tmp_path, "after")
    assert not isinstance(after.proc, forkserver.Forked) and server.broken is not None
    result = after.wait()
    assert isinstance(result, FailedResult) and result.outcome == "runtime_error"
    assert forkserver.serving("onnxruntime", worker_env()) is None


def test_only_backends_that_ask_for_it_get_a_server(tmp_path: Path) -> None:
    try:
        assert forkserver.start("torch-inductor", worker_env(), tmp_path / "log") is None
    finally:
        forkserver.stop()
