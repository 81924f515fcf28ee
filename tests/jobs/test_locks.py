"""One command at a time per run folder and per bundle being written: real processes, real
locks (``flock``), no mocks.

A second ``tune`` / ``tune --continue`` / ``release`` into a run folder another process is
searching, or a ``bundle`` / ``pack`` of a bundle another process is writing, refuses at once
in one line naming the holder's pid (exit 75), and the first finishes with a run folder that
bundles and verifies. A lock left by a process killed with SIGKILL is taken over.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import _bundles as h
import pytest
from _figures import figures
from conftest import dossier_process, subprocess_env
from test_reliability import _dossier, _kill, _log_text, _spec

from dossier.cache import TuningCache
from dossier.errors import ExitCode
from dossier.lock import RUN_LOCK, FolderLock, bundle_lock, run_folder_lock
from dossier.run_folder import CACHE_NAME

SLOW_SELECTION = "-fault=[none|hang]"
"""A baseline, then a trial that hangs until its timeout: the search holds its lock that long."""


@pytest.fixture(scope="module")
def slow_spec(samples_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _spec(samples_dir / "convnet", tmp_path_factory.mktemp("lock-spec"), backend="faulty",
                 selection=SLOW_SELECTION, trial_timeout_s=3.0)


@pytest.fixture(scope="module")
def slower_spec(samples_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _spec(samples_dir / "convnet", tmp_path_factory.mktemp("lock-spec"), backend="faulty",
                 selection=SLOW_SELECTION, trial_timeout_s=10.0)


def _wait_for(condition, proc: subprocess.Popen[bytes], timeout: float = 120) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not condition():
        assert proc.poll() is None, "the first command ended before the moment came"
        assert time.monotonic() < deadline
        time.sleep(0.02)


def _start(args: list[object], env: dict[str, str]) -> subprocess.Popen[bytes]:
    return dossier_process(args, env)


def _result(proc: subprocess.Popen[bytes], timeout: float = 300) -> tuple[int, str]:
    _, stderr = proc.communicate(timeout=timeout)
    return proc.returncode, " ".join(stderr.decode(errors="replace").split())


def _run(args: list[object], env: dict[str, str], timeout: float = 300) -> tuple[int, str]:
    return _result(_start(args, env), timeout)


def _refused_naming(said: str, pid: int) -> bool:
    return said.count("error:") == 1 and f"pid {pid}" in said and "is locked by" in said


def test_a_second_command_into_a_run_folder_in_use_is_refused(slower_spec: Path,
                                                               tmp_path: Path) -> None:
    """While ``tune`` runs: a second ``tune`` into the folder, ``tune --continue`` of it, a
    ``release --work`` of it and a ``bundle`` of it each refuse in one line naming the first's
    pid (exit 75), change nothing, and the first search finishes, bundles and verifies."""
    env = subprocess_env()
    run, out = tmp_path / "run", tmp_path / "out"
    first = _dossier(["tune", slower_spec, "--out", run, "--quiet"], env, tmp_path / "first.log")
    cache = run / CACHE_NAME
    _wait_for(lambda: cache.is_file() and cache.read_bytes().count(b"\n") >= 2, first)
    holder = json.loads((run / RUN_LOCK).read_text())
    assert holder["pid"] == first.pid and holder["host"] and holder["started_at"]
    before = cache.read_bytes()
    seconds = [["tune", slower_spec, "--out", run, "--quiet"], ["tune", "--continue", run],
               ["release", slower_spec, "--out", out, "--work", run, "--quiet"],
               ["bundle", run, "--out", out]]
    t0 = time.monotonic()
    procs = [_start(args, env) for args in seconds]  # together, while the first searches
    results = [_result(p) for p in procs]
    assert first.poll() is None, "the first search should still be running"
    assert time.monotonic() - t0 < 15  # at once, not after waiting for the first
    refused = 0
    for args, (code, said) in zip(seconds, results, strict=True):
        assert code == ExitCode.BUSY and _refused_naming(said, first.pid), (args, code, said)
        refused += 1
    assert cache.read_bytes()[: len(before)] == before
    assert first.wait(timeout=300) == 0, _log_text(tmp_path / "first.log")
    assert not (run / RUN_LOCK).exists()  # released and removed on exit
    c = TuningCache.open(cache)
    assert [t.index for t in c.trials] == list(range(len(c.trials)))
    assert len({t.route for t in c.trials if t.role != "confirm"}) == 2 and c.decision
    code, said = _run(["bundle", run, "--out", out], env)
    assert code == 0, said
    code, said = _run(["verify", out / "convnet-1.dossier", "--integrity-only"], env)
    assert code == 0, said
    figures("second command into a run folder in use", tried=len(seconds), refused=refused)


def _together(spec: Path, tmp_path: Path, rounds: int) -> None:
    """Both start in the same instant (``rounds`` times): exactly one runs and finishes, the
    other refuses with exit 75 naming the winner's pid; the cache holds each route once."""
    env = subprocess_env()
    for i in range(rounds):
        run = tmp_path / f"run-{i}"
        procs = [_start(["tune", spec, "--out", run, "--quiet"], env) for _ in range(2)]
        results = [(*_result(p), p.pid) for p in procs]
        codes = sorted(code for code, _, _ in results)
        assert codes == [0, ExitCode.BUSY], results
        winner = next(pid for code, _, pid in results if code == 0)
        loser = next(said for code, said, _ in results if code != 0)
        assert _refused_naming(loser, winner), loser
        c = TuningCache.open(run / CACHE_NAME)
        routes = [t.route for t in c.trials if t.role != "confirm"]
        assert len(routes) == len(set(routes)) == 2 and c.decision is not None
    figures("two searches into one run folder started together", rounds=rounds,
            one_ran_one_refused=rounds)


def test_two_searches_started_together_one_runs_one_is_refused(slow_spec: Path,
                                                               tmp_path: Path) -> None:
    _together(slow_spec, tmp_path, rounds=1)


@pytest.mark.slow
def test_two_searches_started_together_many_times(slow_spec: Path, tmp_path: Path) -> None:
    _together(slow_spec, tmp_path, rounds=10)


def test_a_lock_left_by_a_killed_search_is_taken_over(slow_spec: Path, tmp_path: Path) -> None:
    """kill -9 leaves the lock file with the dead holder's pid; the kernel dropped its flock,
    so ``tune --continue`` takes it over and finishes."""
    env = subprocess_env()
    run = tmp_path / "run"
    first = _dossier(["tune", slow_spec, "--out", run, "--quiet"], env, tmp_path / "first.log")
    _wait_for(lambda: (run / CACHE_NAME).is_file()
              and (run / CACHE_NAME).read_bytes().count(b"\n") >= 2, first)
    _kill(first)
    assert json.loads((run / RUN_LOCK).read_text())["pid"] == first.pid  # left behind
    code, said = _run(["tune", "--continue", run, "--quiet"], env)
    assert code == 0, said
    assert not (run / RUN_LOCK).exists()
    assert TuningCache.open(run / CACHE_NAME).decision is not None


def test_a_bundle_being_written_is_locked(tmp_path: Path, samples_dir: Path) -> None:
    """A process holding a bundle's lock (this test, through flock) makes ``bundle`` and
    ``pack`` of that bundle refuse naming its pid, writing nothing; released, both succeed."""
    rel = h.released(tmp_path.parent / "lock-released", samples_dir)["convnet"]
    out = tmp_path / "out"
    out.mkdir()
    env = subprocess_env()
    with bundle_lock(out, "convnet-1.dossier"):
        code, said = _run(["bundle", rel.run, "--out", out], env)
        assert code == ExitCode.BUSY and _refused_naming(said, os.getpid()), said
        assert sorted(p.name for p in out.iterdir()) == [".convnet-1.dossier.lock"]
    code, said = _run(["bundle", rel.run, "--out", out], env)
    assert code == 0, said
    with bundle_lock(out, "convnet-1.dossier.tar"):
        code, said = _run(["pack", out / "convnet-1.dossier", "--out", out], env)
        assert code == ExitCode.BUSY and _refused_naming(said, os.getpid()), said
    code, said = _run(["pack", out / "convnet-1.dossier", "--out", out], env)
    assert code == 0, said
    assert sorted(p.name for p in out.iterdir()) == ["convnet-1.dossier", "convnet-1.dossier.tar"]


def _try_lock_in_another_process(run: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", "import sys; from dossier.lock import run_folder_lock\n"
         "with run_folder_lock(sys.argv[1]): pass", str(run)],
        capture_output=True, text=True, env=subprocess_env())


def test_lock_semantics(tmp_path: Path) -> None:
    """Takes by one process nest (``release`` holds its run folder across tune and bundle);
    another process is refused, naming this one; a lock file removed by its holder is never
    shared (a taker that opened it before the removal re-checks the inode and starts again)."""
    import fcntl

    run = tmp_path / "run"
    run.mkdir()
    with run_folder_lock(run), run_folder_lock(run):
        assert (run / RUN_LOCK).exists()
        child = _try_lock_in_another_process(run)
        assert child.returncode != 0 and "BusyError" in child.stderr
        assert re.search(rf"pid {os.getpid()}\b", child.stderr)
    assert not (run / RUN_LOCK).exists()
    assert _try_lock_in_another_process(run).returncode == 0
    lock = FolderLock(run / RUN_LOCK, "run").acquire()
    stale_fd = os.open(run / RUN_LOCK, os.O_RDWR)  # opened before the holder removes it
    lock.release()
    again = FolderLock(run / RUN_LOCK, "run").acquire()
    try:
        fcntl.flock(stale_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # the removed inode is no lock:
        assert _try_lock_in_another_process(run).returncode != 0  # the new one still holds
    finally:
        os.close(stale_fd)
        again.release()
