"""A LoadGen run in a process of its own (``python -m dossier.scenarios.worker REQUEST.json``),
started and bounded from here.

The parent (:func:`measure`) writes a :class:`ScenarioRequest`, starts the child in its own
process group and waits at most the request's time limit: a run that stalls (an engine that
hangs, LoadGen waiting for a query never answered) is killed with its group and fails with
:class:`RunFailed`, one line; nothing it half-wrote is read. The child loads the engine the
production way, N times for N sessions:

- ``bundle``: :func:`dossier.serve.opened` (verified: signature when asked, integrity, this
  host's verdict), the shipped engine loaded as its manifest records it, once per session;
- ``engine``: an engine file loaded by its backend with the route's load-time knobs
  (:meth:`dossier.backends.Backend.load`, as every trial loads one);
- ``synthetic``: no engine, a call that sleeps a fixed time (for tests of the machinery).

It times single inferences first (the median of a few back to back, session 0: the scenario's
floor, see :func:`dossier.scenario.check_bound`), then runs LoadGen
(:func:`dossier.scenarios.driver.run`) and writes ``child.json`` beside LoadGen's logs. The
process's side is :mod:`dossier.scenarios.worker`; this module imports no engine runtime.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from dossier.errors import DossierError, ExitCode
from dossier.files import read_small
from dossier.scenario import BATCH_MAX
from dossier.scenarios.logs import LoadGenRun, read_run
from dossier.scenarios.models import RunSettings

RESULT = "child.json"
"""What the child writes beside LoadGen's logs: its single-inference time, or its error."""
SINGLE_CALLS = 20
"""Back-to-back calls whose median is the single-inference time."""
WARMUP_CALLS = 5
"""Calls per session before anything is timed."""


class RunFailed(DossierError):
    """One LoadGen run did not give a result: it overran its time limit, or its process died
    (exit 4 where it ends a command)."""

    exit_code = ExitCode.TUNE


class ChildError(DossierError):
    """The child's own error (an engine that failed, a bundle refused...), with its exit
    code."""

    exit_code = ExitCode.INVALID


class ScenarioRequest(BaseModel):
    """What a child runs."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    source: Literal["bundle", "engine", "synthetic"]
    """Where the engine comes from."""
    path: str = ""
    """bundle: the bundle (folder, archive or registry reference); engine: the engine file."""
    backend: str = ""
    """engine: the backend's name."""
    route: str = ""
    """engine: the route (its load-time knobs are applied)."""
    validation: str = ""
    """The validation set whose inputs are the queries (bundle: empty, the bundle's own)."""
    sleep_ms: float = Field(0.0, ge=0, le=10_000, allow_inf_nan=False)
    """synthetic: the time one call takes."""
    sessions: int = Field(1, ge=0, le=256)
    """Sessions serving in parallel (worker threads, one engine each); bundle: 0 for as many
    as its shipped route's ``serving_sessions`` says."""
    batch: int = Field(0, ge=0, le=BATCH_MAX)
    """The most waiting queries one call answers; 0 for as many as the route's
    ``serving_batch`` says (1 without it)."""
    verify: dict[str, Any] = Field(default_factory=dict)
    """bundle: keyword arguments of :func:`dossier.serve.opened` (trusted keys, policy...)."""
    settings: RunSettings
    """The LoadGen run."""


class ChildResult(BaseModel):
    """``child.json``."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    single_ms: float | None = Field(None, ge=0, le=1e9, allow_inf_nan=False)
    """Median of single inferences, back to back, before LoadGen ran."""
    error: str | None = Field(None, max_length=2000)
    """Why the child failed."""
    exit_code: int = Field(0, ge=0, le=255)
    """The failure's exit code (that of the DossierError)."""


def measure(req: ScenarioRequest, work: Path, *, timeout_s: float) -> tuple[LoadGenRun, float]:
    """Run ``req`` in a child process in ``work`` (an empty folder); LoadGen's run and the
    single-inference time (ms). RunFailed when it overruns ``timeout_s`` (the child and its
    group are killed) or dies without a result; the child's own error (EngineFailedError,
    InputError...) as it said it."""
    work.mkdir(parents=True, exist_ok=True)
    request = work / "request.json"
    (work / RESULT).unlink(missing_ok=True)  # a killed earlier attempt's, never read as this one's
    request.write_text(req.model_dump_json())
    with open(work / "child.log", "wb") as log:
        proc = subprocess.Popen([sys.executable, "-m", "dossier.scenarios.worker", str(request)],
                                stdout=log, stderr=log, start_new_session=True)
        try:
            proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            raise RunFailed(f"the LoadGen run ({req.settings.kind}, {req.settings.qps:g} QPS) "
                            f"did not finish within {timeout_s:g} s; it was stopped",
                            hint="raise [scenario] run_timeout_s, or look for an engine that "
                                 "hangs") from None
    try:
        out = ChildResult.model_validate_json(read_small(work / RESULT, 1 << 16))
    except (OSError, ValidationError, ValueError):
        tail = (work / "child.log").read_bytes()[-300:].decode("utf-8", "replace").strip()
        raise RunFailed(f"the LoadGen run's process ended (status {proc.returncode}) without a "
                        f"result: {tail.splitlines()[-1] if tail else 'no output'}") from None
    if out.error is not None:
        error = ChildError(out.error)
        error.exit_code = ExitCode(out.exit_code) if out.exit_code in set(ExitCode) \
            else ExitCode.INVALID
        raise error
    return read_run(work / "loadgen"), float(out.single_ms or 0.0)
