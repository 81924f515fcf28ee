"""The parent/child protocol: typed results, and limits the child sets on itself."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from pydantic import ValidationError

from dossier.child import run_child
from dossier.timing import TimingSettings
from dossier.worker import RESULT, BuiltResult, FailedResult, JudgedResult, WorkerRequest


def _request(tmp: Path, **kw: object) -> WorkerRequest:
    return WorkerRequest(mode="validate", backend="onnxruntime", model="", metric="l2",
                         validation=str(tmp / "missing"), threshold=1.0, atol=0.0, rtol=0.0,
                         timing=TimingSettings(), baseline_route="", route="",
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
    run = subprocess.run([sys.executable, "-m", "dossier.worker", str(path)], capture_output=True,
                         timeout=120, check=False)
    assert run.returncode == 1 and not (tmp_path / "r.json").exists()


def test_a_failing_child_reports_a_typed_failure(tmp_path: Path) -> None:
    result = run_child(_request(tmp_path), tmp_path, "validate", 120, 4096)
    assert isinstance(result, FailedResult) and result.outcome == "runtime_error"
    assert "during setup" in result.reason or "during load" in result.reason
    assert "startup" in result.phases_s


def test_a_child_is_paused_only_once_it_follows_its_parent(tmp_path: Path) -> None:
    """Paused straight after its start, a child was stopped before it set its parent-death
    signal; a parent killed then left it stopped for ever (seen after kill -9 of a search
    whose builds were paused). pause() lets it reach its first stage first."""
    import os
    import signal

    from dossier.child import Child

    child = Child(_request(tmp_path), tmp_path, "paused", 120, None)
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
