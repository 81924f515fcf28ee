"""Independent re-measurement of engines: a second timing procedure, to confirm a claim.

A speedup found by one procedure is confirmed by a procedure that differs from it; re-measuring
the same way repeats its bias. Here every engine runs in **its own fresh process** (python -m
dossier.replicate), loaded in the production load configuration
(:meth:`~dossier.backends.Backend.production_load`), alone in that process. The parent drives
rounds: in each round every process times one **steady-state block** (``confirm_warmup``
untimed lead-in runs, then up to ``confirm_runs`` timed runs or ``confirm_block_s`` seconds)
while the others wait idle, and the order rotates from round to round (A B, B A, ... for two).
With ``confirm_processes`` > 1 the rounds are split into that many consecutive spans, and each
span starts new processes (a process generation): a host state that holds for a process's life
is sampled once per generation.
The statistic is the same as the screening's: per round the ratio of the baseline's block
median to the candidate's, summarised over rounds (:func:`dossier.timing.compare`).

The tuner confirms its best screened candidates with it (together with a second process of the
baseline: the confirmation's own A/A check); ``verify --rebench`` re-measures a shipped route
with it.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from pydantic import BaseModel, ConfigDict

from dossier.errors import TuneError
from dossier.spec import ShapeEntry
from dossier.timing import TimingSettings, generations, warm_up
from dossier.worker import _timers, die_with_parent


class EngineRequest(BaseModel):
    """What one measuring process loads and how it times."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    backend: str
    builder: dict[str, Any] = {}
    shapes: list[ShapeEntry] = []
    validation: str
    engine: str
    route: str
    timing: TimingSettings
    parent_pid: int = 0
    """The measuring process dies with this process (set by the parent)."""


@dataclass
class Measured:
    """Samples per engine, per round, and each engine's warm-up runs."""

    rounds: list[list[list[float]]]
    warmup_runs: list[int]
    wall_s: float


class _Process:
    """One engine's measuring process, driven over its stdin and stdout."""

    def __init__(self, req: EngineRequest, work: Path, name: str,
                 env: Mapping[str, str] | None = None) -> None:
        self.path = work / f"{name}.json"
        self.path.write_text(req.model_copy(update={"parent_pid": os.getpid()}).model_dump_json())
        self.log = open(work / f"{name}.log", "wb")  # noqa: SIM115 - closed in close()
        # no pre-exec hook (unsafe once this process has threads): the child sets its
        # parent-death signal itself (see main)
        self.proc = subprocess.Popen(  # noqa: S603 - our own interpreter and module
            [sys.executable, "-m", "dossier.replicate", str(self.path)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.log,
            start_new_session=True, env={**os.environ, **(env or {})})

    def ask(self, command: str, deadline: float) -> dict[str, Any]:
        """Send a command, wait for its one-line JSON answer until ``deadline``."""
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write((command + "\n").encode())
        self.proc.stdin.flush()
        return _read_line(self.proc.stdout, deadline, self)

    def close(self) -> None:
        with contextlib.suppress(ProcessLookupError, OSError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()
        for stream in (self.proc.stdin, self.proc.stdout, self.log):
            with contextlib.suppress(OSError):
                stream.close()  # type: ignore[union-attr]

    def tail(self) -> str:
        self.log.flush()
        text = Path(self.log.name).read_text(errors="replace").strip().splitlines()
        return text[-1] if text else ""


def _read_line(stream: IO[bytes], deadline: float, proc: _Process) -> dict[str, Any]:
    left = deadline - time.monotonic()
    ready, _, _ = select.select([stream], [], [], max(left, 0))
    if not ready:
        raise TuneError(f"independent re-measurement: {proc.path.stem} did not answer in time")
    line = stream.readline()
    if not line:
        proc.proc.wait()
        raise TuneError(f"independent re-measurement: {proc.path.stem} exited "
                        f"(status {proc.proc.returncode}) {proc.tail()}".strip())
    data = json.loads(line)
    if not isinstance(data, dict):
        raise TuneError(f"independent re-measurement: {proc.path.stem} answered {line[:80]!r}")
    if "error" in data:
        raise TuneError(f"independent re-measurement: {proc.path.stem}: {data['error']}")
    return data


def measure(backend: str, engines: Sequence[tuple[Path, str]], validation: Path,
            settings: TimingSettings, *, builder: dict[str, Any] | None = None,
            shapes: Sequence[ShapeEntry] = (), timeout_s: float | None = None,
            work: Path | None = None, env: Mapping[str, str] | None = None) -> Measured:
    """Time ``engines`` ((path, route) each) one fresh process each, over
    ``settings.confirm_rounds`` rounds of steady-state blocks in rotating order, in
    ``settings.confirm_processes`` process generations (each engine's warm-up runs are the most
    any of its processes needed). The processes' requests and logs go to ``work`` (created;
    default: a temporary folder).

    Raises TuneError when a process fails to load its engine, dies, or the whole measurement
    runs past ``timeout_s`` (default: twice the trial timeout). ``env`` is added to the
    processes' environment (what the backend needs to load the engines)."""
    deadline = time.monotonic() + (timeout_s or 2 * settings.trial_timeout_s)
    t0 = time.perf_counter()
    if work is not None:
        work.mkdir(parents=True, exist_ok=True)
    k = len(engines)
    out: list[list[list[float]]] = [[] for _ in engines]
    warm = [0] * k
    with (contextlib.nullcontext(str(work)) if work is not None
          else tempfile.TemporaryDirectory(prefix="dossier-replicate-")) as tmp:
        for g, span in enumerate(generations(settings.confirm_rounds,
                                             settings.confirm_processes)):
            procs: list[_Process] = []
            try:
                for i, (path, route) in enumerate(engines):
                    req = EngineRequest(backend=backend, builder=dict(builder or {}),
                                        shapes=list(shapes), validation=str(validation),
                                        engine=str(path), route=route, timing=settings)
                    name = f"engine-{i}" if g == 0 else f"engine-{i}-gen{g}"
                    procs.append(_Process(req, Path(tmp), name, env))
                for i, p in enumerate(procs):
                    warm[i] = max(warm[i], int(_read_line(p.proc.stdout, deadline,  # type: ignore[arg-type]
                                                          p)["warmup_runs"]))
                for r in span:
                    for idx in [(r + j) % k for j in range(k)]:
                        out[idx].append(procs[idx].ask("block", deadline)["samples_ms"])
            finally:
                for p in procs:
                    p.close()
    return Measured(rounds=out, warmup_runs=warm, wall_s=time.perf_counter() - t0)


# ------------------------------------------------------------------------------ the child
def _serve(req: EngineRequest) -> None:
    from dossier.backends import get_backend
    from dossier.routes import Route
    from dossier.validation import load_validation_set

    backend = get_backend(req.backend)
    backend.configure(req.builder, req.shapes)
    vset = load_validation_set(Path(req.validation))
    runner = backend.load(Path(req.engine), Route.parse(req.route))
    fn = _timers(runner, vset)  # one sample: one pass over every validation pair's inputs

    s = req.timing
    _say({"warmup_runs": warm_up(fn, s, 1)})
    for line in sys.stdin:
        if line.strip() != "block":
            break
        for _ in range(s.confirm_warmup):
            fn(0)
        samples: list[float] = []
        start = time.perf_counter()
        while len(samples) < s.confirm_runs and (
                len(samples) < 10 or time.perf_counter() - start < s.confirm_block_s):
            samples.append(fn(0))
        _say({"samples_ms": samples})


_PROTOCOL: list[IO[str]] = []


def _say(data: dict[str, Any]) -> None:
    out = _PROTOCOL[0] if _PROTOCOL else sys.stdout
    out.write(json.dumps(data) + "\n")
    out.flush()


def main(argv: list[str]) -> int:
    """Entry point of a measuring process: load, warm up, then one block per ``block`` line."""
    # answers go to the original stdout; anything a library prints goes to the log (stderr)
    _PROTOCOL.append(os.fdopen(os.dup(1), "w"))
    os.dup2(2, 1)
    req = EngineRequest.model_validate_json(Path(argv[1]).read_text())
    die_with_parent(req.parent_pid)
    try:
        _serve(req)
    except Exception as exc:  # noqa: BLE001 - reported to the parent, which raises TuneError
        _say({"error": f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc) else ''}"})
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
