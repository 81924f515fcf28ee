"""Child processes of the worker (``python -m dossier.jobs.worker REQUEST``): start, watch, pause,
kill, and read the typed result.

A child runs in its own process group (so a timeout kills its compilers too), with its
parent-death signal and memory limit set by the child itself at start (see
:func:`dossier.jobs.worker.main`): no pre-exec hook runs between fork and exec. A child that exceeds
its wall-clock limit is killed; time spent paused (SIGSTOP, while the parent measures another
trial) does not count against the limit, nor time spent in its ``wait`` stage (waiting for the
next turn's process on standby to finish its imports, at most
:data:`~dossier.jobs.worker.STANDBY_WAIT_S`: that wait is charged to no route).

A child started *on standby* (:meth:`Child.go`) runs its interpreter start, its imports and its
backend's setup, then waits, loading nothing, until the parent hands it its final request: the
confirmation starts its next measuring process so while one measures, and the search its next
trial's process while one trial runs.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from pydantic import ValidationError

from dossier.diskfull import DISK_FULL_STATUS, disk_full_error, host_io, is_disk_full
from dossier.files import replace_small
from dossier.jobs import forkserver
from dossier.jobs.worker import (
    IMPORTING,
    RESULT,
    STANDBY_WAIT_S,
    FailedResult,
    WorkerRequest,
    WorkerResult,
)

logger = logging.getLogger(__name__)

LOG_TAIL_LINES = 20
WAIT_GRACE_S = 5.0
"""How much longer than its bound a process may stay in its ``wait`` stage uncounted."""
WAIT_STAGE = "wait"
"""The stage of a process waiting for the next turn's standby (see
:func:`dossier.jobs.worker._let_the_next_import`)."""
START_WAIT_S = 30.0
"""How long :meth:`Child.pause` lets a starting child run to its first stage (its interpreter
start and imports) before stopping it anyway."""


class Child:
    """One started worker process."""

    def __init__(self, req: WorkerRequest, work: Path, name: str,
                 env: Mapping[str, str] | None = None, *, standby: bool = False) -> None:
        """Its time and memory limits are the request's (``timeout_s``, ``memory_mb``).
        ``standby``: start the process now, but let it do no more than its imports and setup
        until :meth:`go`; its time limit counts from then."""
        self.name = name
        self.timeout = req.timeout_s
        self.log = work / f"{name}.log"
        self.req = req.model_copy(update={
            "spawned_at": time.time(), "parent_pid": os.getpid(),
            "result": str(work / f"{name}.result.json"), "stage": str(work / f"{name}.stage")})
        self.work = work
        req_path = self._request_path = work / f"{name}.request.json"
        with host_io(work, f"starting {name}"):
            req_path.write_text(self.req.model_dump_json())
            Path(self.req.result).unlink(missing_ok=True)
            Path(self.req.stage).write_text("start")
        full_env = worker_env(env)
        self.started = time.monotonic()
        self.paused_s = 0.0
        self._paused_at: float | None = None
        self.waited_s = 0.0
        """Time seen in its ``wait`` stage (not counted against its limit)."""
        self._waiting_at: float | None = None
        self._result: WorkerResult | None = None
        self.standby = standby
        self.prestarted = standby
        args = [sys.executable, "-m", "dossier.jobs.worker", *(["--standby"] if standby else []),
                str(req_path)]
        # a memory limit counts the address space: a forked worker's holds the server's imports
        server = None if standby or req.memory_mb else forkserver.serving(req.backend, full_env)
        forked = server.fork(req_path, self.log, full_env) if server is not None else None
        self.proc: subprocess.Popen[bytes] | forkserver.Forked
        if forked is not None:
            self.proc = forked
        else:
            with open(self.log, "wb") as log:
                self.proc = subprocess.Popen(  # noqa: S603 - our own interpreter and module
                    args, stdin=subprocess.PIPE if standby else subprocess.DEVNULL,
                    stdout=log, stderr=log, env=full_env, start_new_session=True)
        logger.debug("%s: %s process %d %s%s; its log: %s", name, req.mode, self.proc.pid,
                     "forked" if forked is not None else "started",
                     " on standby" if standby else "", self.log)

    def go(self, req: WorkerRequest, *, name: str | None = None) -> None:
        """Hand a child on standby its final request (same backend and setup, e.g. other
        engines or another rotation offset); its time limit starts now. A child that ended
        while it waited is read as such by :meth:`wait`. ``name``: the name it goes by from
        now on (started under a neutral one before it was known): its log is renamed to
        match, its request, stage and result files keep the names it started with. Its
        limits stay those it started with."""
        if not self.standby or self.proc.stdin is None:
            raise ValueError(f"{self.name} was not started on standby")
        if name is not None and name != self.name:
            log = self.work / f"{name}.log"
            with host_io(self.work, f"starting {name}"), contextlib.suppress(FileNotFoundError):
                os.replace(self.log, log)  # the process writes on into the same file
            logger.debug("%s: process %d goes on as %s; its log: %s", self.name,
                         self.proc.pid, name, log)
            self.name, self.log = name, log
        final = req.model_copy(update={k: getattr(self.req, k) for k in (
            "spawned_at", "parent_pid", "timeout_s", "memory_mb", "result", "stage")})
        with host_io(self.work, f"starting {self.name}"):
            replace_small(self._request_path, final.model_dump_json().encode(),
                          suffix=".go.tmp")
        self.req = final
        with contextlib.suppress(BrokenPipeError, OSError):
            self.proc.stdin.write(b"go\n")
            self.proc.stdin.close()
        self.standby = False
        self.started = time.monotonic()
        self.waited_s, self._waiting_at = 0.0, None

    def ended_on_standby(self) -> bool:
        """Whether this child, started on standby, has ended before it began its final
        request (its last stage its start, its setup or its standby): it ran nothing of that
        request, so its end says nothing of it (a stray signal, the host's memory killer, a
        death between :meth:`go` and the request being read)."""
        return self.prestarted and self.proc.poll() is not None \
            and self._stage() in (*IMPORTING, "standby")

    def _signal(self, sig: int) -> None:
        """``sig`` to the child's process group; to the child alone while it has none yet (a
        forked worker makes its group as it starts)."""
        with contextlib.suppress(ProcessLookupError, PermissionError):
            try:
                os.killpg(self.proc.pid, sig)
            except ProcessLookupError:
                os.kill(self.proc.pid, sig)

    def pause(self) -> None:
        """Stop the child and everything in its process group (SIGSTOP). A child still starting
        (it has not yet set its parent-death signal, which it does before its first stage) is
        let run that far first: stopped before it, it would outlive a parent killed meanwhile,
        stopped for ever."""
        if self._paused_at is None and self.proc.poll() is None:
            until = time.monotonic() + START_WAIT_S
            while self._stage() == "start" and self.proc.poll() is None \
                    and time.monotonic() < until:
                time.sleep(0.01)
            self._signal(signal.SIGSTOP)
            self._paused_at = time.monotonic()

    def resume(self) -> None:
        """Let a paused child go on (SIGCONT); its paused time does not count."""
        if self._paused_at is not None:
            self._signal(signal.SIGCONT)
            self.paused_s += time.monotonic() - self._paused_at
            self._paused_at = None

    def kill(self) -> None:
        """Kill the child's process group and reap it."""
        self._signal(signal.SIGKILL)
        self.proc.wait()
        if self.proc.stdin is not None:
            with contextlib.suppress(OSError):
                self.proc.stdin.close()

    def _left(self) -> float:
        if self.standby:  # waiting for its turn: no limit runs yet
            return self.timeout
        now = time.monotonic()
        waiting = self._stage() == WAIT_STAGE
        if waiting and self._waiting_at is None:
            self._waiting_at = now
        elif not waiting and self._waiting_at is not None:
            self.waited_s += now - self._waiting_at
            self._waiting_at = None
        waited = self.waited_s
        if waiting:  # the next turn's imports: no limit runs meanwhile, up to the worker's
            # own bound on that wait (a process stuck in it is timed again after that)
            waited += min(now - self._waiting_at, STANDBY_WAIT_S + WAIT_GRACE_S)  # type: ignore[operator]
        return self.timeout - (now - self.started - self.paused_s - waited)

    def poll(self) -> WorkerResult | None:
        """The result once the child has ended (killing it past its limit), else None."""
        if self._result is not None:
            return self._result
        rc = self.proc.poll()
        if rc is None:
            if self._paused_at is not None or self._left() > 0:
                return None
            self.kill()
            logger.info("%s: killed after %g s during %s; its log: %s", self.name, self.timeout,
                        self._stage(), self.log)
            self._result = FailedResult(outcome="timeout", log_tail=self._tail(), reason=(
                f"killed after {self.timeout:g} s during {self._stage()}"))
            return self._result
        self._result = self._read(rc)
        return self._result

    def wait(self) -> WorkerResult:
        """Block until the child ends or runs out of time."""
        try:
            while True:
                try:
                    self.proc.wait(timeout=max(0.01, min(self._left(), 1.0)))
                except subprocess.TimeoutExpired:
                    pass
                result = self.poll()
                if result is not None:
                    return result
        except BaseException:
            self.kill()
            raise

    def _stage(self) -> str:
        try:
            return Path(self.req.stage).read_text() or "start"
        except OSError:
            return "start"

    def _tail(self) -> str:
        try:
            lines = self.log.read_text(errors="replace").strip().splitlines()
        except OSError:
            return ""
        return "\n".join(lines[-LOG_TAIL_LINES:])

    def _disk_full(self, said: str, stage: str) -> Exception:
        """The host ran out of room: the half-written engine goes, nothing is recorded."""
        built = self.req.engine if self.req.mode in ("trial", "build") else None
        if built:  # never a bundle's engine (validate)
            Path(built).unlink(missing_ok=True)
        return disk_full_error(said if is_disk_full(said) else "No space left on device",
                               Path(built).parent if built else self.work,
                               f"{self.name} was in its {stage} stage")

    def _read(self, rc: int) -> WorkerResult:
        stage = self._stage()
        tail = self._tail()
        if rc == DISK_FULL_STATUS or rc == -signal.SIGXFSZ:  # the host's fault: record nothing
            raise self._disk_full(tail, stage)
        if rc < 0:
            sig = signal.Signals(-rc).name
            hint = " (possibly out of memory)" if -rc == signal.SIGKILL else ""
            return FailedResult(outcome="crashed", log_tail=tail,
                                reason=f"killed by {sig} during {stage}{hint}")
        try:
            result = RESULT.validate_json(Path(self.req.result).read_bytes())
            reason = str(getattr(result, "reason", "") or "")
            if isinstance(result, FailedResult) and is_disk_full(reason):
                raise self._disk_full(reason, stage)  # a library that said so only in words
            return result
        except OSError:
            pass
        except ValidationError as exc:
            return FailedResult(outcome="crashed", log_tail=tail, reason=(
                f"wrote an unreadable result during {stage} ({exc.error_count()} errors)"))
        if "MemoryError" in tail:
            return FailedResult(outcome="crashed", log_tail=tail,
                                reason=f"out of memory during {stage}")
        last = tail.splitlines()[-1:] or [""]
        return FailedResult(outcome="crashed", log_tail=tail, reason=(
            f"exited with status {rc} during {stage} without a result {last[0]}").strip())


def worker_env(env: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment a worker process runs in: this process's, unbuffered output, the
    fault handler on, and ``env`` on top."""
    return {**os.environ, "PYTHONUNBUFFERED": "1", "PYTHONFAULTHANDLER": "1", **(env or {})}


def run_child(req: WorkerRequest, work: Path, name: str,
              env: Mapping[str, str] | None = None) -> WorkerResult:
    """Run one worker request in its own process (under the request's limits) and wait for
    its result."""
    return Child(req, work, name, env).wait()


def keep_log(log: Path, as_log: Path) -> None:
    """``log`` also as ``as_log`` (a hard link, else a copy; nothing when it is gone)."""
    with contextlib.suppress(OSError):
        as_log.unlink(missing_ok=True)
        try:
            os.link(log, as_log)
        except OSError:
            shutil.copyfile(log, as_log)


def clear_work(work: Path, keep: Sequence[str]) -> None:
    """Remove the work folder of a finished search but the (non-empty) logs of the children
    named in ``keep`` (the trials that failed: what someone debugging them reads); the folder
    goes when none is kept."""
    kept = {f"{name}.log" for name in keep}
    with contextlib.suppress(OSError):
        for entry in list(work.iterdir()):
            if entry.is_dir() and not entry.is_symlink():
                shutil.rmtree(entry, ignore_errors=True)
            elif entry.name not in kept or entry.stat().st_size == 0:  # an empty log says nothing
                entry.unlink(missing_ok=True)
        if not any(work.iterdir()):
            work.rmdir()
