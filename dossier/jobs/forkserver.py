"""The fork server: worker processes forked from one process that has done their imports.

A worker process started as ``python -m dossier.jobs.worker`` spends its first 0.25-0.35 s (on
two cores) starting the interpreter and importing pydantic, numpy, pyarrow and dossier: a small
search of ten trials and three measuring processes spends 3-4 s on that. The fork server is
one process, started once per search, that has done those imports and then forks each worker
from itself, so a worker starts in milliseconds and imports only its runtime. Nothing but
those imports ran in the server: not the runtime (ONNX Runtime's import starts a thread, which
a fork would not carry over), no engine, no session. Its other threads (numpy's BLAS pool,
pyarrow's allocator) are ones their libraries rebuild after a fork.

A worker is forked twice (the server forks, that child forks the worker and leaves), so its
parent becomes the process that asked for it, which declared itself a child subreaper
(``PR_SET_CHILD_SUBREAPER``): that process reaps it, its parent-death signal follows that
process, and the rest (its own session and process group, its log, its limits, its stages,
its exit status) is as for a worker started afresh (:class:`dossier.jobs.child.Child`).

Only for backends that ask for it (:attr:`dossier.backends.SearchTraits.fork_workers`: ONNX Runtime;
not yet AOTInductor or TensorRT, whose workers start on standby instead), only while the worker would get the server's environment and working folder
unchanged, and never for a process started on standby; otherwise, and whenever the server
cannot be used (it died, did not start in time, a fork failed), the worker starts afresh.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import logging
import os
import select
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

READY_WAIT_S = 30.0
"""How long a first request waits for the server's imports before the worker starts afresh."""
REPLY_WAIT_S = 10.0
"""How long a request waits for the forked worker's process id."""
REPARENT_WAIT_S = 5.0
"""How long a forked worker waits to be handed to the asking process (it then leaves)."""
PR_SET_CHILD_SUBREAPER = 36
UNREAD = frozenset({"PYTEST_CURRENT_TEST"})
"""Environment variables no import of the server reads, which may change while it runs (the
forked worker gets the value of its request)."""


class Forked:
    """A worker forked by the server, as :class:`subprocess.Popen` shows a started one: its
    ``pid``, :meth:`poll`, :meth:`wait` and ``returncode`` (negative: the signal that ended
    it). The asking process is its parent (a subreaper), so it reaps it."""

    stdin = None

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            try:
                pid, status = os.waitpid(self.pid, os.WNOHANG)
            except ChildProcessError:  # reaped elsewhere: its status is lost
                self.returncode = -signal.SIGKILL
                return self.returncode
            if pid:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        end = None if timeout is None else time.monotonic() + timeout
        delay = 0.0005
        while self.poll() is None:
            if end is not None and time.monotonic() >= end:
                raise subprocess.TimeoutExpired(f"worker {self.pid}", timeout or 0.0)
            time.sleep(delay if end is None else min(delay, max(end - time.monotonic(), 0)))
            delay = min(delay * 2, 0.05)
        assert self.returncode is not None
        return self.returncode


class ForkServer:
    """One server (see the module's documentation), started for ``backend`` with ``env``."""

    def __init__(self, backend: str, env: Mapping[str, str], log: Path) -> None:
        self.backend, self.env, self.cwd = backend, dict(env), os.getcwd()
        self._ready = False
        self._lock = threading.Lock()
        self.broken: str | None = None
        """Why the server is no longer used (None while it is)."""
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_SET_CHILD_SUBREAPER)")
        with open(log, "ab") as err:
            self.proc = subprocess.Popen(  # noqa: S603 - our own interpreter and module
                [sys.executable, "-m", "dossier.jobs.forkserver", str(os.getpid()), backend],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err, env=self.env,
                start_new_session=True)
        self.started = time.monotonic()

    def serves(self, backend: str, env: Mapping[str, str]) -> bool:
        """Whether a worker of ``backend`` with environment ``env``, started here and now,
        would be the same process as one forked by this server."""
        return (self.broken is None and backend == self.backend
                and _read(env) == _read(self.env) and os.getcwd() == self.cwd)

    def ready(self) -> bool:
        """Wait for the server's imports (at most :data:`READY_WAIT_S` from its start); whether
        it can fork."""
        if self.broken is None and not self._ready:
            said = self._line(READY_WAIT_S - (time.monotonic() - self.started))
            if said != "ready":
                self._break(f"not ready ({said or 'no answer'})")
            self._ready = self.broken is None
        return self.broken is None

    def _line(self, wait_s: float) -> str | None:
        out = self.proc.stdout
        assert out is not None
        ready, _, _ = select.select([out], [], [], max(wait_s, 0.0))
        if not ready:
            return None
        return out.readline().decode(errors="replace").strip() or None

    def fork(self, request: Path, log: Path, env: Mapping[str, str]) -> Forked | None:
        """Fork a worker for ``request`` (``python -m dossier.jobs.worker REQUEST``) writing to
        ``log``, with ``env`` as its environment (one it :meth:`serves`); None when the server
        cannot (the caller then starts one afresh). One request at a time: a request and its
        answer are one line each on the server's pipes."""
        with self._lock:
            return self._fork(request, log, env)

    def _fork(self, request: Path, log: Path, env: Mapping[str, str]) -> Forked | None:
        if not self.ready():
            return None
        try:
            assert self.proc.stdin is not None
            self.proc.stdin.write(json.dumps({"request": str(request), "log": str(log),
                                              "env": dict(env)}).encode() + b"\n")
            self.proc.stdin.flush()
        except OSError as exc:
            self._break(f"the request could not be sent: {exc}")
            return None
        said = self._line(REPLY_WAIT_S)
        if said is None or not said.lstrip("-").isdigit() or int(said) <= 0:
            self._break(f"no worker forked ({said or 'no answer'})")
            return None
        return Forked(int(said))

    def _break(self, why: str) -> None:
        self.broken = why
        logger.info("fork server of %s: %s; workers start afresh", self.backend, why)
        self.close()

    def close(self) -> None:
        """End the server (its forked workers go on)."""
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        with contextlib.suppress(OSError, subprocess.TimeoutExpired):
            self.proc.wait(timeout=5)
        for pipe in (self.proc.stdin, self.proc.stdout):
            with contextlib.suppress(OSError):
                if pipe is not None:
                    pipe.close()


def _read(env: Mapping[str, str]) -> dict[str, str]:
    return {k: v for k, v in env.items() if k not in UNREAD}


_servers: dict[str, ForkServer] = {}


def start(backend: str, env: Mapping[str, str], log: Path) -> ForkServer | None:
    """Start a server for ``backend``'s workers (with ``env``, their environment), unless the
    backend does not ask for it or one that serves ``env`` here runs already (one that does
    not is ended); the one this process uses from then on (:func:`serving`), until
    :func:`stop`. None when there is none."""
    from dossier.backends import get_backend

    got = _servers.pop(backend, None)
    if got is not None:
        if got.serves(backend, env):
            _servers[backend] = got
            return got
        got.close()  # started with another environment or folder, or broken
    try:
        if not get_backend(backend).traits.fork_workers:
            return None
        _servers[backend] = server = ForkServer(backend, env, log)
    except (OSError, AttributeError, ValueError) as exc:
        logger.info("no fork server for %s: %s", backend, exc)
        return None
    return server


def serving(backend: str, env: Mapping[str, str]) -> ForkServer | None:
    """The running server that can fork a worker of ``backend`` with ``env`` now, else None."""
    got = _servers.get(backend)
    return got if got is not None and got.serves(backend, env) else None


def stop() -> None:
    """End every server this process started."""
    while _servers:
        _servers.popitem()[1].close()


# ------------------------------------------------------------------------------ the server
def _worker(job: dict[str, Any], parent_pid: int) -> None:
    """In the forked worker: become what ``python -m dossier.jobs.worker REQUEST`` would be
    (its own session, its log on stdout and stderr, nothing on stdin), wait to be the asking
    process's child, run, and never return into the server's loop."""
    status = 1
    try:
        os.setsid()
        fd = os.open(job["log"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        os.close(fd)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.close(null)
        end = time.monotonic() + REPARENT_WAIT_S
        while os.getppid() != parent_pid:
            if time.monotonic() > end:
                os._exit(1)
            time.sleep(0.0002)
        os.environ.clear()
        os.environ.update(job["env"])
        import faulthandler

        faulthandler.enable()
        from dossier.jobs import worker

        sys.argv = ["dossier.jobs.worker", job["request"]]
        status = worker.main(sys.argv)
    except BaseException:  # noqa: BLE001 - the worker's end, whatever it is
        import traceback

        with contextlib.suppress(Exception):
            traceback.print_exc()
    finally:
        from dossier.jobs.worker import leave

        leave(status)


def serve(parent_pid: int, backend: str) -> int:
    """The server's loop: import, say ``ready``, then fork a worker for every request line
    and answer its process id (0 when the fork failed), until end of input."""
    from dossier.jobs.worker import die_with_parent

    die_with_parent(parent_pid)
    # what every worker imports before its runtime; not the runtime (ONNX Runtime's import
    # starts a thread, which a fork would not carry over)
    import dossier.measure.timing  # noqa: F401
    import dossier.routes  # noqa: F401
    import dossier.validation  # noqa: F401
    from dossier.backends import get_backend

    get_backend(backend)
    os.write(1, b"ready\n")
    for line in sys.stdin.buffer:
        try:
            job = json.loads(line)
            said, tell = os.pipe()
            middle = os.fork()
        except (ValueError, OSError):
            os.write(1, b"0\n")
            continue
        if middle == 0:  # the middle process: fork the worker, tell its id, leave
            try:
                os.close(said)
                pid = os.fork()
                if pid == 0:
                    os.close(tell)
                    _worker(job, parent_pid)
                os.write(tell, f"{pid}\n".encode())
            finally:
                os._exit(0)
        os.close(tell)
        os.waitpid(middle, 0)  # gone: its worker is the asking process's child now
        with os.fdopen(said, "rb") as got:
            forked = got.read().strip() or b"0"
        os.write(1, forked + b"\n")
    return 0


if __name__ == "__main__":
    from dossier.jobs.worker import leave

    leave(serve(int(sys.argv[1]), sys.argv[2]))
