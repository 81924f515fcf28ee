"""The co-tenant load a shared target is measured under: ``[target] co_tenants = K`` busy
processes that dossier starts before a search's first measurement and stops after its last.

Each is a process of its own (``python -c``), pinned to one of the engine's cores (round
robin), at the ordinary priority (nice 0, whatever the search's own), spinning on the CPU.
Bounded three ways: it dies with the process that started it (PR_SET_PDEATHSIG, checked
again in its loop, so a ``kill -9`` of the release leaves none behind), it stops by itself
after ``max_s`` seconds, and :meth:`CoTenants.stop` kills it. A load that fails to start
stops the search before anything is measured (TuneError; ``--continue`` resumes).

The load is dossier's own: :class:`~dossier.measure.conditions.Watch` counts it with this
process's descendants, so "other processes" in a measurement's conditions stay the host's
other work, which is what "busier than declared" is judged on.
"""

from __future__ import annotations

import contextlib
import os
import select
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence

from dossier.errors import TuneError

START_S = 10.0
"""How long each load process has to say it is running."""

_SPIN = r"""
import ctypes, os, signal, sys, time
parent, deadline, core = int(sys.argv[1]), time.monotonic() + float(sys.argv[2]), int(sys.argv[3])
try:
    ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)
except (OSError, AttributeError):
    pass
if os.getppid() != parent:
    sys.exit(1)
try:
    os.setpriority(os.PRIO_PROCESS, 0, 0)
except (OSError, AttributeError):
    pass
if core >= 0 and hasattr(os, "sched_setaffinity"):
    os.sched_setaffinity(0, [core])
sys.stdout.write("running\n")
sys.stdout.flush()
n = 0
while True:
    n += 1
    if n % 200000 == 0 and (time.monotonic() > deadline or os.getppid() != parent):
        sys.exit(0)
"""


class CoTenants:
    """``count`` busy processes on ``cores`` (see the module's documentation)."""

    def __init__(self, count: int, cores: Sequence[int], max_s: float) -> None:
        self.count, self.cores, self.max_s = count, list(cores), max_s
        self.procs: list[subprocess.Popen[bytes]] = []

    def start(self) -> None:
        """Start the load and wait until every process runs (TuneError when one does not)."""
        me = os.getpid()
        try:
            for i in range(self.count):
                core = self.cores[i % len(self.cores)] if self.cores else -1
                self.procs.append(subprocess.Popen(
                    [sys.executable, "-c", _SPIN, str(me), f"{self.max_s:g}", str(core)],
                    stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE))
            deadline = time.monotonic() + START_S
            for p in self.procs:
                assert p.stdout is not None
                ready, _, _ = select.select([p.stdout], [], [],
                                            max(deadline - time.monotonic(), 0.0))
                line = p.stdout.readline() if ready else b""
                if line.strip() != b"running":
                    err = (p.stderr.read(2000).decode(errors="replace").strip()
                           if p.poll() is not None and p.stderr else "")
                    raise TuneError(
                        f"the co-tenant load (target.co_tenants = {self.count}) did not start: "
                        + (err.splitlines()[-1] if err else f"no word after {START_S:g} s"),
                        hint="nothing was measured; fix the cause and run again with --continue")
        except OSError as exc:  # this interpreter could not be started again
            self.stop()
            raise TuneError(f"the co-tenant load could not start: {exc.strerror}",
                            hint="nothing was measured; run again with --continue") from exc
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        """Kill every load process and reap it."""
        for p in self.procs:
            with contextlib.suppress(OSError):
                p.kill()
        for p in self.procs:
            with contextlib.suppress(OSError, subprocess.TimeoutExpired):
                p.wait(timeout=5)
            for f in (p.stdout, p.stderr):
                if f is not None:
                    f.close()
        self.procs = []

    def pids(self) -> list[int]:
        """The load processes' pids (while running)."""
        return [p.pid for p in self.procs]


@contextlib.contextmanager
def cotenants(count: int, cores: Sequence[int], max_s: float) -> Iterator[CoTenants | None]:
    """``count`` busy processes for the duration (none when ``count`` is 0)."""
    if count <= 0:
        yield None
        return
    load = CoTenants(count, cores, max_s)
    load.start()
    try:
        yield load
    finally:
        load.stop()
