"""The trial worker: one child process per trial (``python -m dossier.jobs.worker REQUEST``).

The child builds the route, loads the engine, runs the validation set, and times the engine
against the baseline engine in rounds (:func:`dossier.measure.timing.sample_rounds`; a
measuring process of the confirmation, :func:`dossier.measure.timing.process_rounds`: the
timing is the measurement package's, the process around it this module's). It writes its
stage to a marker file before each step, so the parent can say where a child that died was,
and writes its result as JSON (atomically) at the end. Statistics are computed by the parent
from the raw samples.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import os
import resource
import signal
import sys
import time
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter

from dossier.files import replace_small
from dossier.knobs import KnobDatabase
from dossier.measure.timing import TimingSettings
from dossier.spec import AccuracyRule, ShapeEntry

if TYPE_CHECKING:
    from dossier.backends import Backend, BuildInfo, Runner
    from dossier.measure.timing import Engine, Timed
    from dossier.routes import Route
    from dossier.validation import Pair, ValidationSet


class Prebuilt(BaseModel):
    """An engine a trial takes instead of building it (see :mod:`dossier.build_plan`)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    build_s: float | None = None
    """Its build time, when a build job of this search built it; None for an earlier trial's
    engine (no build time is spent on this trial)."""
    facts: dict[str, str] = {}
    """Its build facts."""


class WorkerRequest(AccuracyRule):
    """What the parent asks a child to do (the accuracy rule to judge by among it)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    mode: Literal["build", "trial", "validate", "measure"]
    backend: str
    model: str
    validation: str
    timing: TimingSettings
    baseline_route: str
    builder: dict[str, Any] = {}
    shapes: list[ShapeEntry] = []
    baseline_engine: str | None = None
    route: str | None = None
    engine: str | None = None
    prebuilt: Prebuilt | None = None
    """Set when ``engine`` is in place already (a build job's, or an earlier trial's with the
    same build key): the trial builds nothing."""
    result: str
    stage: str
    spawned_at: float = 0.0
    """time.time() when the parent started the process (to measure startup)."""
    parent_pid: int = 0
    """The parent's pid: the child exits at once when its parent is already gone, and is
    killed when the parent dies (set inside the child, not by a pre-exec hook)."""
    timeout_s: float = Field(gt=0)
    """Wall-clock limit of the child (the trial timeout), watched by the parent
    (:class:`dossier.jobs.child.Child`)."""
    memory_mb: int | None = None
    """Address-space limit of the child (RLIMIT_AS; the trial memory limit, None: none), set
    by the child itself at start."""
    engines: list[tuple[str, str]] = []
    """``measure``: the engines one measuring process of the confirmation loads, (path, route)
    each: the baseline, a second load of it (the A/A), then the candidates."""
    offset: int = 0
    """``measure``: which engine goes first in the first round (the rotation's start, so
    successive processes start with different engines)."""
    then: tuple[str, int] | None = None
    """``measure`` and ``trial``: the process started on standby for the next turn (the next
    measuring process, the next trial), (its stage file, its pid): this one starts timing
    only once that one has finished its imports (or ended), so they never overlap the
    timing."""
    race_below: float | None = None
    """``trial``: the bar the trial races against (:func:`dossier.decision.race_bar`): it stops
    after ``timing.race_rounds`` rounds once its interval lies wholly below this speedup.
    None: it races only if the accuracy filter rejects it."""
    race_why: str = ""
    """What that bar is, for the trial's record."""
    calibration: str | None = None
    """The calibration set's folder, for builds of routes that need one (static
    quantization); read only by those."""
    build_scratch: str | None = None
    """The search's folder for what the builds of several routes share
    (:attr:`dossier.backends.Backend.build_scratch`); None: nothing is shared."""
    knobs: KnobDatabase | None = None
    """The search's knob database, read once by the parent: the child takes it instead of
    reading the backend's again (ONNX Runtime's probe imports onnx and opens a session, about
    0.5 s a trial where the build takes milliseconds). None: the child reads its own."""


class _Result(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    phases_s: dict[str, float] = {}
    """Seconds per stage of the child (startup, setup, build, load, validate, time...)."""


class BuiltResult(_Result):
    """A build job finished: the engine file is written."""

    outcome: Literal["built"]
    build_s: float
    facts: dict[str, Any] = {}
    started_at: float = 0.0
    """time.time() when the build call started (so the parent can subtract paused time)."""
    ended_at: float = 0.0


class JudgedResult(_Result):
    """A trial (built or copied, loaded, judged, timed) or a validation of an existing engine."""

    outcome: Literal["ok", "rejected"]
    reason: str | None = None
    """The accuracy failure, when rejected."""
    losses: dict[str, dict[str, float | None]] = {}
    worst_loss: float | None = None
    build_s: float | None = None
    facts: dict[str, Any] = {}
    samples_ms: list[float] | None = None
    sample_rounds: list[int] | None = None
    """The round of each sample (the unit of replication)."""
    baseline_samples_ms: list[float] | None = None
    baseline_sample_rounds: list[int] | None = None
    warmup_runs: int | None = None
    baseline_warmup_runs: int | None = None
    raced: str | None = None
    """Why the timing stopped before its last round (:class:`dossier.measure.timing.Race`)."""


class FailedResult(_Result):
    """The job did not produce what it was asked for. ``timeout`` and ``crashed`` (a signal, or
    no result) are set by the parent; the child reports the others."""

    outcome: Literal["build_failed", "runtime_error", "crashed", "timeout"]
    reason: str
    build_s: float | None = None
    facts: dict[str, Any] = {}
    traceback: str | None = None
    log_tail: str | None = None
    """The last lines the child wrote, when it died without a result."""


class MeasuredResult(_Result):
    """A measuring process of the confirmation: samples per engine (in request order), per
    round, and each engine's warm-up runs."""

    outcome: Literal["measured"]
    rounds: list[list[list[float]]]
    warmup_runs: list[int]
    waited_share: float | None = Field(None, ge=0.0, le=1.0)
    """Of its threads' ready time while timing, the share they waited for a core
    (:func:`dossier.measure.conditions.thread_times`; None where not readable)."""


WorkerResult = Annotated[BuiltResult | JudgedResult | FailedResult | MeasuredResult,
                         Field(discriminator="outcome")]
"""What a child reports, by outcome."""
RESULT = TypeAdapter(WorkerResult)


_PHASES: dict[str, float] = {}
_current: list[tuple[str, float]] = []
"""The phase under way and when it began (none before the first)."""


def _stage(req: WorkerRequest, name: str) -> None:
    """Mark the start of a phase (for the parent, and for the phase timings)."""
    now = time.perf_counter()
    if _current:
        phase, began = _current.pop()
        _PHASES[phase] = _PHASES.get(phase, 0.0) + now - began
    _current.append((name, now))
    Path(req.stage).write_text(name)


def _result(req: WorkerRequest, result: BaseModel) -> None:
    replace_small(Path(req.result), result.model_dump_json().encode())


def die_with_parent(parent_pid: int) -> None:
    """Die with the parent (PR_SET_PDEATHSIG), and leave at once if it is gone already; done
    by the child itself rather than in a pre-exec hook, which is unsafe once the parent has
    threads. 0: no parent to follow."""
    if parent_pid:
        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)
        if os.getppid() != parent_pid:
            os._exit(1)


def _guard(req: WorkerRequest) -> None:
    """Die with the parent (PR_SET_PDEATHSIG), leave at once if it is gone already, and apply
    the memory limit: done here rather than in a pre-exec hook, which is unsafe once the parent
    has threads."""
    die_with_parent(req.parent_pid)
    if req.memory_mb:
        limit = req.memory_mb << 20
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))


def _backend(req: WorkerRequest) -> Backend:
    """The configured backend."""
    from dossier.backends import get_backend

    _stage(req, "setup")
    backend = get_backend(req.backend)
    if req.knobs is not None:
        backend.adopt_knob_database(req.knobs)
    backend.configure(req.builder, req.shapes)
    return backend


def _guarded(build: Callable[[], BuildInfo], t0: float) -> BuildInfo | dict[str, Any]:
    """``build()``, or the record a failed build leaves (``build_failed`` with the compiler's
    reason; ``crashed`` when it ran out of memory), its seconds counted from ``t0``."""
    from dossier.backends import BuildError

    try:
        return build()
    except BuildError as exc:
        return {"outcome": "build_failed", "reason": str(exc) or type(exc).__name__,
                "build_s": time.perf_counter() - t0}
    except MemoryError:
        return {"outcome": "crashed", "reason": "out of memory during build",
                "build_s": time.perf_counter() - t0}


def _build(backend: Backend, req: WorkerRequest, route: Route) -> BuildInfo:
    """Build ``route`` into the request's engine file, with the calibration set when the route
    needs one."""
    if req.calibration and backend.needs_calibration(route, backend.knob_database()):
        from dossier.datasets import load_calibration_set

        backend.use_calibration(load_calibration_set(Path(req.calibration)))
    backend.use_build_scratch(Path(req.build_scratch) if req.build_scratch else None)
    return backend.build(Path(req.model), route, Path(req.engine or ""))


def _setup(req: WorkerRequest) -> tuple[Backend, ValidationSet]:
    """The configured backend and the validation set."""
    from dossier.validation import load_validation_set

    return _backend(req), load_validation_set(Path(req.validation))


def _timers(runner: Runner, groups: Sequence[Sequence[Pair]]) -> Timed:
    """Sample ``i`` = one inference per group (:meth:`ValidationSet.timing_groups`), on the
    group's pair ``i`` modulo its size: the inputs rotate, and the samples of a model with
    several shapes stay unimodal."""
    prepared = [[runner.prepare(p.inputs) for p in g] for g in groups]
    return lambda i: sum(runner.timed(g[i % len(g)]) for g in prepared)


def rotation(groups: Sequence[Sequence[Pair]]) -> int:
    """The ``n_inputs`` the timing functions take: the largest group's size (sample ``i`` of
    a block runs pair ``i`` modulo it, and :func:`_timers` modulo its own group's)."""
    return max((len(g) for g in groups), default=1)


def timed_engines(backend: Backend, groups: Sequence[Sequence[Pair]],
                  pair: Sequence[tuple[Path, Route]],
                  first: tuple[Runner, float] | None = None) -> list[Engine]:
    """One :data:`~dossier.measure.timing.Engine` per (engine path, route), timing ``groups``
    (:func:`_timers`). ``first``: the first one's runner, already loaded, and the seconds its
    load took. Loaded once and kept, unless the backend reloads per block
    (:attr:`~dossier.backends.SearchTraits.reload_per_block`): then :class:`_Switching` decides."""
    if backend.traits.reload_per_block:
        return _Switching(backend, groups, pair, first).engines()
    runners = [first[0] if first else backend.load(*pair[0])] + \
        [backend.load(e, r) for e, r in pair[1:]]
    return [functools.partial(_same, _timers(r, groups)) for r in runners]


class _Switching:
    """The engines of a backend that reloads per block. The first engine's load time decides
    for all of them (:attr:`~dossier.backends.SearchTraits.switch_pause_s`): within the pause, each
    engine is loaded afresh for every block and released after it (one alive at a time);
    longer, each is loaded once and kept open, and a block that follows another engine's starts
    with the pause, in which that engine's threads stop spinning."""

    def __init__(self, backend: Backend, groups: Sequence[Sequence[Pair]],
                 pair: Sequence[tuple[Path, Route]], first: tuple[Runner, float] | None) -> None:
        self.backend, self.groups, self.pair = backend, groups, pair
        self.first = first[0] if first else None
        self.keep: bool | None = None if first is None else self._keeps(first[1])
        self.kept: dict[int, Timed] = {}
        self.last: int | None = None

    def _keeps(self, load_s: float) -> bool:
        return 0 < self.backend.traits.switch_pause_s < load_s

    def engines(self) -> list[Engine]:
        return [functools.partial(self.open, i) for i in range(len(self.pair))]

    def open(self, i: int) -> Timed:
        if self.keep and self.last is not None and self.last != i:
            time.sleep(self.backend.traits.switch_pause_s)
        self.last = i
        if i in self.kept:
            return self.kept[i]
        if i == 0 and self.first is not None:
            runner, self.first = self.first, None
        else:
            t0 = time.perf_counter()
            runner = self.backend.load(*self.pair[i])
            if self.keep is None:
                self.keep = self._keeps(time.perf_counter() - t0)
        fn = _timers(runner, self.groups)
        if self.keep:
            self.kept[i] = fn
        return fn


def _same(fn: Timed) -> Timed:
    return fn


def run_trial(req: WorkerRequest) -> dict[str, Any]:
    """Build (unless the engine is in place), validate and time one route; return the raw
    result. With ``then`` (the next trial's process on standby), wait for its imports once
    both engines are loaded, before timing."""
    from dossier.backends import BuildInfo, EngineRuntimeError
    from dossier.measure.timing import Race, flatten, sample_rounds, warm_up_each
    from dossier.routes import Route
    from dossier.validation import judge

    backend, vset = _setup(req)
    route = Route.parse(req.route or "")
    engine = Path(req.engine or "")
    _stage(req, "build")
    t0 = time.perf_counter()
    prebuilt = req.prebuilt  # a build job's engine, or an earlier trial's: in place
    got = _guarded(lambda: BuildInfo(dict(prebuilt.facts)) if prebuilt is not None
                   else _build(backend, req, route), t0)
    if isinstance(got, dict):
        return got
    info = got
    build_s = req.prebuilt.build_s if req.prebuilt is not None else time.perf_counter() - t0
    base: dict[str, Any] = {"build_s": build_s, "facts": info.facts}
    try:
        _stage(req, "load")
        t_load = time.perf_counter()
        runner = backend.load(engine, route)
        load_s = time.perf_counter() - t_load
        _stage(req, "validate")
        outputs = {p.name: runner.run(p.inputs) for p in vset.pairs}
        acc = judge(outputs, vset, req.metric, req.threshold, atol=req.atol, rtol=req.rtol)
        base.update(losses=acc.losses, worst_loss=acc.worst)
        _stage(req, "time")
        base_engine = Path(req.baseline_engine) if req.baseline_engine else engine
        # the baseline trial: an A/A check against a second load of itself
        pair = [(engine, route), (base_engine, Route.parse(req.baseline_route))]
        first = (runner, load_s)
        del runner  # held by the engines only: released with them when they reload per block
        groups = vset.timing_groups(req.timing.inputs)
        engines, turns = timed_engines(backend, groups, pair, first), rotation(groups)
        del first
        _let_the_next_import(req, "time")
        warm, base_warm = warm_up_each(engines, req.timing, turns)
        race = Race(req.timing, below=req.race_below, why=req.race_why, rejected=not acc)
        cand, ref = sample_rounds(engines, req.timing, turns, stop=race)
    except (EngineRuntimeError, MemoryError) as exc:  # a failure's record has no losses
        failed = {"build_s": build_s, "facts": info.facts}
        if isinstance(exc, MemoryError):
            return {**failed, "outcome": "crashed", "reason": "out of memory while running"}
        return {**failed, "outcome": "runtime_error", "reason": str(exc)}
    outcome = "ok" if acc else "rejected"
    (samples, rounds), (base_samples, base_rounds) = flatten(cand), flatten(ref)
    return {**base, "outcome": outcome, "reason": acc.failure, "samples_ms": samples,
            "sample_rounds": rounds, "baseline_samples_ms": base_samples,
            "baseline_sample_rounds": base_rounds, "warmup_runs": warm,
            "baseline_warmup_runs": base_warm, "raced": race.reason}


def run_build(req: WorkerRequest) -> dict[str, Any]:
    """Only build the route (backends that load in a fresh process)."""
    from dossier.routes import Route

    backend = _backend(req)
    _stage(req, "build")
    t0, started = time.perf_counter(), time.time()
    info = _guarded(lambda: _build(backend, req, Route.parse(req.route or "")), t0)
    if isinstance(info, dict):
        return info
    return {"outcome": "built", "build_s": time.perf_counter() - t0, "facts": info.facts,
            "started_at": started, "ended_at": time.time()}


def run_validate(req: WorkerRequest) -> dict[str, Any]:
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


def run_measure(req: WorkerRequest) -> dict[str, Any]:
    """One measuring process of the confirmation: load every engine of ``req.engines`` in
    production configuration, warm each up, then time them in rounds, the engine at
    ``req.offset`` first (:func:`dossier.measure.timing.process_rounds`)."""
    from dossier.measure.conditions import thread_times, waited_share
    from dossier.measure.timing import process_rounds, warm_up_each
    from dossier.routes import Route

    backend, vset = _setup(req)
    _stage(req, "load")
    pairs = [(Path(e), Route.parse(r)) for e, r in req.engines]
    groups = vset.timing_groups(req.timing.inputs)
    engines, turns = timed_engines(backend, groups, pairs), rotation(groups)
    _let_the_next_import(req, "warm")
    warm = warm_up_each(engines, req.timing, turns)
    _stage(req, "time")
    before = thread_times()
    out = process_rounds(engines, req.timing, turns, offset=req.offset)
    return {"outcome": "measured", "rounds": out, "warmup_runs": warm,
            "waited_share": waited_share(before, thread_times())}


def _stand_by(req: WorkerRequest, path: Path) -> WorkerRequest:
    """Import the backend's runtime, then wait (loading nothing) until the parent says go on
    stdin, and return the final request it wrote to ``path``; leave at once on end of input
    (the parent no longer needs this process)."""
    _backend(req).import_runtime()
    _stage(req, "standby")
    if not sys.stdin.buffer.readline():
        leave(0)
    final = WorkerRequest.model_validate_json(path.read_text())
    if final.mode != req.mode or final.backend != req.backend:
        raise ValueError(f"a {req.mode} process of {req.backend} on standby was handed a "
                         f"{final.mode} request of {final.backend}")
    return final


IMPORTING = ("", "start", "setup")
"""The stages of a process before its runtime is imported (then ``standby``, when started so,
until its turn)."""
def _seconds(name: str, default: float) -> float:
    try:
        value = float(os.environ.get(name, default))
    except ValueError:
        return default
    return value if 0 < value < float("inf") else default


STANDBY_WAIT_S = _seconds("DOSSIER_STANDBY_WAIT_S", 60.0)
"""The longest a measuring or trial process waits for the next one's imports; a standby not
ready by then is killed (the next turn starts a process of its own), and this one times. The
wait is charged to no route: the parent does not count a process's ``wait`` stage against its
time limit (:class:`dossier.jobs.child.Child`). ``DOSSIER_STANDBY_WAIT_S`` sets another (tests)."""


def _let_the_next_import(req: WorkerRequest, then: str) -> None:
    """With ``req.then`` (the next turn's process on standby), wait in stage ``wait`` for its
    imports, so that they never overlap a timing; then enter stage ``then``."""
    if req.then is not None:
        _stage(req, "wait")
        _wait_for_standby(*req.then)
    _stage(req, then)


def _wait_for_standby(stage: str, pid: int) -> bool:
    """Return once the process ``pid`` (on standby, its stage file ``stage``) is past its
    imports (True), or has ended; when :data:`STANDBY_WAIT_S` has passed first, kill it and
    its process group (a standby that stalls must not hold up this turn, nor take the next
    one: the parent sees it ended on standby and starts a process of its own) and return
    False."""
    until = time.monotonic() + STANDBY_WAIT_S
    while time.monotonic() < until:
        try:
            if Path(stage).read_text() not in IMPORTING:
                return True
            state = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
        except (OSError, IndexError):
            return True  # gone (or no /proc to ask): nothing left to wait for
        if state in ("Z", "X"):
            return True
        time.sleep(0.005)
    # our parent's child, not reaped yet (its pid cannot have been reused), in its own
    # process group
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)
    print(f"dossier worker: the next turn's process {pid} was not ready after "
          f"{STANDBY_WAIT_S:g} s on standby: killed (the next turn starts its own)",
          file=sys.stderr, flush=True)
    return False


_MODES = {"build": run_build, "trial": run_trial, "validate": run_validate,
          "measure": run_measure}


def main(argv: list[str]) -> int:
    """Entry point of the child process."""
    from dossier.diskfull import is_disk_full, probe

    standby = argv[1:2] == ["--standby"]
    path = Path(argv[2] if standby else argv[1])
    req = WorkerRequest.model_validate_json(path.read_text())
    _guard(req)
    startup = time.time() - req.spawned_at if req.spawned_at else None
    try:
        if standby:
            req = _stand_by(req, path)
        data = _MODES[req.mode](req)
    except Exception as exc:  # noqa: BLE001 - any failure of a trial is the trial's outcome
        if is_disk_full(exc):  # the host's fault, not the route's: say so by the exit status
            return _disk_full(exc)
        tb = traceback.format_exc(limit=3)
        stage = Path(req.stage).read_text() if Path(req.stage).exists() else "setup"
        data = {"outcome": "runtime_error", "reason": f"{type(exc).__name__} during {stage}: {exc}",
                "traceback": tb}
    if data.get("outcome") not in ("ok", "built", "rejected", "measured"):  # the disk, or the route?
        full = data.get("reason") if is_disk_full(str(data.get("reason"))) else \
            probe(Path(req.engine)) if req.engine and req.mode in ("trial", "build") else None
        if full:
            return _disk_full(full)
    try:
        _stage(req, "report")
        data["phases_s"] = {**({"startup": startup} if startup is not None else {}), **_PHASES}
        _result(req, RESULT.validate_python(data))
    except OSError as exc:
        if is_disk_full(exc):
            return _disk_full(exc)
        raise
    return 0


def _disk_full(why: object) -> int:
    """Say it where possible (the log is on the full disk too) and return the exit status."""
    from dossier.diskfull import DISK_FULL_STATUS

    with contextlib.suppress(OSError):
        print(f"dossier worker: disk full: {why}", file=sys.stderr)
    return DISK_FULL_STATUS


def leave(status: int) -> None:
    """End the process at once: the result is on disk (written atomically) and the logs are
    flushed, so the interpreter's teardown (unloading ONNX Runtime, pyarrow, numpy; 0.1-0.5 s
    on two cores, longer than a millisecond build) would only delay the parent."""
    with contextlib.suppress(Exception):
        sys.stdout.flush()
        sys.stderr.flush()
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None).fflush(None)  # what native code wrote through C stdio
    os._exit(status)


if __name__ == "__main__":
    leave(main(sys.argv))
