"""The trial worker: one child process per trial (``python -m dossier.worker REQUEST``).

The child builds the route, loads the engine, runs the validation set, and times the engine
against the baseline engine in rounds (:func:`dossier.timing.sample_rounds`). It writes its stage to a marker file before each step, so
the parent can say where a child that died was, and writes its result as JSON (atomically) at
the end. Statistics are computed by the parent from the raw samples.
"""

from __future__ import annotations

import json
import os
import sys
import time
import traceback
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

from dossier.spec import ShapeEntry
from dossier.timing import TimingSettings


class WorkerRequest(BaseModel):
    """What the parent asks a child to do."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    mode: Literal["build", "trial", "validate"]
    backend: str
    model: str
    validation: str
    metric: str
    threshold: float
    atol: float
    rtol: float
    timing: TimingSettings
    baseline_route: str
    builder: dict[str, Any] = {}
    shapes: list[ShapeEntry] = []
    baseline_engine: str | None = None
    route: str | None = None
    engine: str | None = None
    reuse_engine: str | None = None
    """An engine built earlier with the same build-time knobs: copied instead of rebuilt."""
    reuse_facts: dict[str, str] = {}
    """The build facts of that engine."""
    prebuilt_build_s: float | None = None
    """Set when ``engine`` was built by an earlier ``build`` process: its build time."""
    result: str
    stage: str
    spawned_at: float = 0.0
    """time.time() when the parent started the process (to measure startup)."""


_PHASES: dict[str, float] = {}
_current: list = [None, 0.0]


def _stage(req: WorkerRequest, name: str) -> None:
    """Mark the start of a phase (for the parent, and for the phase timings)."""
    now = time.perf_counter()
    if _current[0] is not None:
        _PHASES[_current[0]] = _PHASES.get(_current[0], 0.0) + now - _current[1]
    _current[0], _current[1] = name, now
    Path(req.stage).write_text(name)


def _result(req: WorkerRequest, data: dict) -> None:
    tmp = Path(req.result + ".tmp")
    tmp.write_text(json.dumps(data))
    os.replace(tmp, req.result)


def _setup(req: WorkerRequest, *, validation: bool = True):  # type: ignore[no-untyped-def]
    """The configured backend and (unless not needed) the validation set."""
    from dossier.backends import get_backend
    from dossier.validation import load_validation_set

    _stage(req, "setup")
    backend = get_backend(req.backend)
    backend.configure(req.builder, req.shapes)
    return backend, load_validation_set(Path(req.validation)) if validation else None


def _timers(runner, vset):  # type: ignore[no-untyped-def]
    """One sample = one pass over every validation pair's inputs (so the inputs rotate and the
    samples of a model with several shapes stay unimodal)."""
    prepared = [runner.prepare(p.inputs) for p in vset.pairs]
    return lambda _i: sum(runner.timed(x) for x in prepared)


def timed_engines(backend, vset, pair, first=None):  # type: ignore[no-untyped-def]
    """One :data:`~dossier.timing.Engine` per (engine path, route): loaded afresh for every
    block when the backend asks for it, else loaded once (``first``: the first one's runner,
    already loaded) and kept."""
    if backend.reload_per_block:
        return [lambda e=e, r=r: _timers(backend.load(e, r), vset) for e, r in pair]
    runners = [first or backend.load(*pair[0])] + [backend.load(e, r) for e, r in pair[1:]]
    fns = [_timers(r, vset) for r in runners]
    return [lambda f=f: f for f in fns]


def run_trial(req: WorkerRequest) -> dict:
    """Build, validate and time one route; return the raw result."""
    from dossier.backends import BuildError, EngineRuntimeError
    from dossier.routes import Route
    from dossier.timing import flatten, sample_rounds, warm_up
    from dossier.validation import judge

    backend, vset = _setup(req)
    route = Route.parse(req.route or "")
    engine = Path(req.engine or "")
    _stage(req, "build")
    t0 = time.perf_counter()
    try:
        if req.prebuilt_build_s is not None:  # built by a separate process already
            from dossier.backends import BuildInfo

            info = BuildInfo(dict(req.reuse_facts))
        elif req.reuse_engine:  # same build-time knobs as an earlier trial: same compiler output
            import shutil

            from dossier.backends import BuildInfo

            shutil.copyfile(req.reuse_engine, engine)
            info = BuildInfo({**req.reuse_facts, "reused_engine": Path(req.reuse_engine).name})
        else:
            info = backend.build(Path(req.model), route, engine)
    except BuildError as exc:
        return {"outcome": "build_failed", "reason": str(exc) or type(exc).__name__,
                "build_s": time.perf_counter() - t0}
    except MemoryError:
        return {"outcome": "crashed", "reason": "out of memory during build",
                "build_s": time.perf_counter() - t0}
    build_s = (req.prebuilt_build_s if req.prebuilt_build_s is not None
               else None if req.reuse_engine else time.perf_counter() - t0)
    base = {"build_s": build_s, "facts": info.facts}
    try:
        _stage(req, "load")
        runner = backend.load(engine, route)
        _stage(req, "validate")
        outputs = {p.name: runner.run(p.inputs) for p in vset.pairs}
        acc = judge(outputs, vset, req.metric, req.threshold, atol=req.atol, rtol=req.rtol)
        base.update(losses=acc.losses, worst_loss=acc.worst)
        _stage(req, "time")
        base_engine = Path(req.baseline_engine) if req.baseline_engine else engine
        # the baseline trial: an A/A check against a second load of itself
        pair = [(engine, route), (base_engine, Route.parse(req.baseline_route))]
        first = None if backend.reload_per_block else runner
        del runner  # with reload_per_block, one engine alive at a time: each block loads its own
        engines = timed_engines(backend, vset, pair, first)
        warm, base_warm = (warm_up(e(), req.timing, 1) for e in engines)
        cand, ref = sample_rounds(engines, req.timing, 1)
    except EngineRuntimeError as exc:
        return {**base, "outcome": "runtime_error", "reason": str(exc)}
    except MemoryError:
        return {**base, "outcome": "crashed", "reason": "out of memory while running"}
    outcome = "ok" if acc else "rejected"
    (samples, rounds), (base_samples, base_rounds) = flatten(cand), flatten(ref)
    return {**base, "outcome": outcome, "reason": acc.failure, "samples_ms": samples,
            "sample_rounds": rounds, "baseline_samples_ms": base_samples,
            "baseline_sample_rounds": base_rounds, "warmup_runs": warm,
            "baseline_warmup_runs": base_warm}


def run_build(req: WorkerRequest) -> dict:
    """Only build the route (backends that load in a fresh process)."""
    from dossier.backends import BuildError
    from dossier.routes import Route

    backend, _ = _setup(req, validation=False)
    _stage(req, "build")
    t0 = time.perf_counter()
    try:
        info = backend.build(Path(req.model), Route.parse(req.route or ""), Path(req.engine or ""))
    except BuildError as exc:
        return {"outcome": "build_failed", "reason": str(exc) or type(exc).__name__,
                "build_s": time.perf_counter() - t0}
    except MemoryError:
        return {"outcome": "crashed", "reason": "out of memory during build",
                "build_s": time.perf_counter() - t0}
    return {"outcome": "built", "build_s": time.perf_counter() - t0, "facts": info.facts}


def run_validate(req: WorkerRequest) -> dict:
    """Load an existing engine and judge it on the validation set (``verify --recheck``)."""
    from dossier.routes import Route
    from dossier.validation import judge

    backend, vset = _setup(req)
    _stage(req, "load")
    runner = backend.load(Path(req.engine or ""), Route.parse(req.route or ""))
    _stage(req, "validate")
    outputs = {p.name: runner.run(p.inputs) for p in vset.pairs}
    acc = judge(outputs, vset, req.metric, req.threshold, atol=req.atol, rtol=req.rtol)
    return {"outcome": "ok" if acc else "rejected", "reason": acc.failure, "losses": acc.losses,
            "worst_loss": acc.worst}


_MODES = {"build": run_build, "trial": run_trial, "validate": run_validate}


def main(argv: list[str]) -> int:
    """Entry point of the child process."""
    req = WorkerRequest.model_validate_json(Path(argv[1]).read_text())
    startup = time.time() - req.spawned_at if req.spawned_at else None
    try:
        data = _MODES[req.mode](req)
    except Exception as exc:  # noqa: BLE001 - any failure of a trial is the trial's outcome
        tb = traceback.format_exc(limit=3)
        stage = Path(req.stage).read_text() if Path(req.stage).exists() else "setup"
        data = {"outcome": "runtime_error", "reason": f"{type(exc).__name__} during {stage}: {exc}",
                "traceback": tb}
    _stage(req, "report")
    data["phases_s"] = {**({"startup": startup} if startup is not None else {}), **_PHASES}
    _result(req, data)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
