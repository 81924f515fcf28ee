"""A test-only backend: ONNX Runtime plus a ``fault`` knob that really breaks the trial's process.

Registered for the test suite only (``tests/plugins``: see :mod:`dossier_test_backends`) and
marked ``for_tests`` (left out of the backend names offered to users, never served from a
bundle). The faults are real: ``abort`` calls os.abort() (SIGABRT), ``segv`` sends SIGSEGV to the process, ``hang``
sleeps forever, ``oom`` allocates until the memory limit stops it, ``raise`` fails the build,
``nan`` makes every output NaN, ``slow`` sleeps 2 ms per run, ``drift`` is a route that is
faster (with ``pace=held`` or ``clock``, 1.5 times shorter) and right on the inputs a
validation set of standard normal samples holds, but off by 10% (alternating sign) on inputs
whose mean magnitude is above 2: what a precision route can do on data outside the range it was judged on (the
hold-out set's test case). ``kill_worker`` kills the process that started the trial's
process when the engine is loaded (SIGKILL to the parent: a Ray measure worker lost mid-trial;
never use it with the local executor, whose parent is the search itself), ``kill_worker_once``
does so only the first time for a trial (a marker under DOSSIER_FAULT_DIR remembers it).

Two more test-only knobs, both load-time (the engine is the baseline's, byte for byte), give
routes a known speed. ``gain`` names a route's true speedup: ``x1.25`` runs exactly 1.25 times
as fast as ``none``, ``x1.05`` 1.05 times, and ``aa`` as fast (the default's twin under another
name: an A/A route). ``pace`` says what makes it so:

- ``pace=clock`` (what tests use): the engine still runs, but the latency a run reports when
  timed (:meth:`~dossier.backends.interface.Runner.timed`) comes from a simulated clock, not
  from the host: 2.0 ms divided by the gain (and by 1.5 for ``fault=drift``; ``fault=slow``
  adds its 2 ms), times a small multiplicative noise (log-normal, ``CLOCK_NOISE``) so that
  intervals are not degenerate. The noise is drawn from a generator seeded per load with the
  route, the load's number in its process and the process id: two loads of one route (the
  baseline and its A/A load) read equal in distribution, no two read the same sequence, and no
  reading depends on how busy or fast the host is. A test that needs a gain confirmed gets it
  on any host: ``-pace=clock -gain=[none|x1.25]``.
- ``pace=held`` (what the benchmarks of bench/ use to calibrate the decision rule on real
  time): every run busy-waits until 2.0 ms divided by the gain have passed since it began. A
  busy-wait rather than a sleep, so that a loaded host delays it as it delays real work: whether
  a gain is confirmed then depends on the host, which is what bench/calibration.py measures and
  what no test may rely on.
"""

from __future__ import annotations

import os
import signal
import time
import zlib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from dossier.backends.interface import BuildError, BuildInfo, Runner
from dossier.backends.onnxruntime import OnnxRuntimeBackend
from dossier.knobs import Knob, KnobDatabase, KnobPhase
from dossier.routes import Route

FAULTS = ("none", "abort", "segv", "hang", "oom", "raise", "nan", "slow", "kill_worker",
          "kill_worker_once", "drift")
DRIFT_GAIN = 1.5
"""``fault=drift``: with ``pace=held`` or ``clock``, runs this many times shorter."""
SLOW_MS = 2.0
"""``fault=slow``: what it adds to every run (a real sleep; with ``pace=clock``, on the clock)."""
DRIFT_RANGE = 2.0
"""``fault=drift``: outputs go wrong on inputs whose mean magnitude is above this (a standard
normal's is about 0.8)."""

PACE_MS = 2.0
"""What one run takes with ``pace=held`` or ``clock`` and ``gain=none`` (the model's own time
included)."""
GAINS = {"none": 1.0, "aa": 1.0, "x1.05": 1.05, "x1.25": 1.25}
"""``gain`` values and the factor by which each shortens the paced run."""
CLOCK_NOISE = 0.02
"""``pace=clock``: the standard deviation of the log of each reading's noise factor."""


def paced_ms(route: Route) -> float:
    """What each run of ``route`` takes with ``pace=held`` or ``clock``, whichever it names
    (0: not paced)."""
    values = route.as_dict()
    if values.get("pace", "off") == "off":
        return 0.0
    drift = DRIFT_GAIN if values.get("fault") == "drift" else 1.0
    return PACE_MS / GAINS.get(values.get("gain", "none"), 1.0) / drift


def hold_ms(route: Route) -> float:
    """How long each run of ``route`` is really held to (0: not held)."""
    return paced_ms(route) if route.as_dict().get("pace") == "held" else 0.0


class Clock:
    """The simulated clock of one load of a ``pace=clock`` route: each reading is ``ms`` times a
    log-normal noise factor (``CLOCK_NOISE``), drawn from a generator seeded with the route, the
    load's number in this process and the process id (see the module's docstring)."""

    loads = 0
    """Clocks made in this process so far."""

    def __init__(self, route: Route, ms: float) -> None:
        Clock.loads += 1
        self.ms = ms
        self._rng = np.random.default_rng(
            [zlib.crc32(route.text().encode()), Clock.loads, os.getpid()])

    def __call__(self) -> float:
        """One reading, in milliseconds."""
        return self.ms * float(np.exp(self._rng.normal(0.0, CLOCK_NOISE)))


def clock(route: Route) -> Clock | None:
    """A fresh clock for a load of ``route``, when it names ``pace=clock``."""
    values = route.as_dict()
    if values.get("pace") != "clock":
        return None
    slow = SLOW_MS if values.get("fault") == "slow" else 0.0
    return Clock(route, paced_ms(route) + slow)


class _FaultyRunner(Runner):
    def __init__(self, inner: Runner, fault: str, pace_ms: float = 0.0,
                 timer: Clock | None = None) -> None:
        self._inner, self._fault, self._pace_s = inner, fault, pace_ms / 1000
        self._clock = timer

    def timed_impl(self, prepared: object) -> float:
        """A real run; its latency from the route's clock where it has one (``pace=clock``),
        else as measured."""
        if self._clock is None:
            return super().timed_impl(prepared)
        self.run_impl(prepared)  # type: ignore[arg-type]
        return self._clock()

    def run_impl(self, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        start = time.perf_counter()
        out = self._inner.run(inputs)
        while time.perf_counter() - start < self._pace_s:
            pass
        if self._fault == "nan":
            return {k: np.full_like(v, np.nan) for k, v in out.items()}
        if self._fault == "slow":
            time.sleep(SLOW_MS / 1000)
        if self._fault == "drift" and np.mean(
                [np.mean(np.abs(v)) for v in inputs.values()]) > DRIFT_RANGE:
            return {k: v * (1 + 0.1 * np.resize(np.array([1, -1], v.dtype), v.shape))
                    for k, v in out.items()}
        return out

    def close_impl(self) -> None:
        self._inner.close()


class FaultyBackend(OnnxRuntimeBackend):
    """ONNX Runtime with a fault-injection knob (tests only)."""

    name = "faulty"
    for_tests = True

    def knob_database_impl(self) -> KnobDatabase:
        db = super().knob_database_impl()
        fault = Knob(name="fault", values=FAULTS, default="none", phase=KnobPhase.BUILD,
                     help="test-only: break the trial's process in the named way")
        pace = Knob(name="pace", values=("off", "held", "clock"), default="off",
                    phase=KnobPhase.LOAD,
                    help=f"test-only: held, every run takes {PACE_MS} ms (busy-wait, real "
                         "time); clock, every timed run reads that on a simulated clock")
        gain = Knob(name="gain", values=tuple(GAINS), default="none", phase=KnobPhase.LOAD,
                    help="test-only: with pace=held or clock, shorten every run by this factor "
                         "(the ground truth: x1.25 is exactly 1.25 times as fast)")
        return db.model_copy(update={"backend": self.name,
                                     "knobs": (fault, pace, gain, *db.knobs)})

    def _options(self, route: Route, phase: KnobPhase | None) -> tuple[Any, list[str]]:
        return super()._options(_plain(route), phase)

    def build_impl(self, model: Path, route: Route, engine: Path) -> BuildInfo:
        fault = route.as_dict().get("fault", "none")
        if fault == "abort":
            os.abort()
        if fault == "segv":
            os.kill(os.getpid(), signal.SIGSEGV)
        if fault == "hang":
            while True:
                time.sleep(60)
        if fault == "oom":
            hog: list[bytearray] = []
            while True:
                hog.append(bytearray(256 << 20))
        if fault == "raise":
            raise BuildError("injected build failure")
        return super().build_impl(model, route, engine)

    def load_impl(self, engine: Path, route: Route) -> Runner:
        fault = route.as_dict().get("fault", "none")
        if fault in ("kill_worker", "kill_worker_once"):
            mark = Path(os.environ.get("DOSSIER_FAULT_DIR", ".")) / f"killed-{engine.name}"
            if fault == "kill_worker" or not mark.exists():
                mark.touch()
                os.kill(os.getppid(), signal.SIGKILL)
                time.sleep(60)  # this process dies with its parent (PR_SET_PDEATHSIG)
        return _FaultyRunner(super().load_impl(engine, route),
                             route.as_dict().get("fault", "none"), hold_ms(route), clock(route))

    def engine_facts(self, route: Route, db: KnobDatabase) -> dict[str, bool]:
        return super().engine_facts(_plain(route), db)


def _plain(route: Route) -> Route:
    """``route`` without the test-only knobs (what ONNX Runtime is given)."""
    return Route.of({k: v for k, v in route.values if k not in ("fault", "pace", "gain")})
