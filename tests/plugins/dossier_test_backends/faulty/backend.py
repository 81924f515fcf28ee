"""A test-only backend: ONNX Runtime plus a ``fault`` knob that really breaks the trial's process.

Registered for the test suite only (``tests/plugins``: see :mod:`dossier_test_backends`) and
marked ``for_tests`` (left out of the backend names offered to users, never served from a
bundle). The faults are real: ``abort`` calls os.abort() (SIGABRT), ``segv`` sends SIGSEGV to the process, ``hang``
sleeps forever, ``oom`` allocates until the memory limit stops it, ``raise`` fails the build,
``nan`` makes every output NaN, ``slow`` sleeps 2 ms per run, ``drift`` is a route that is
faster (with ``pace=held``, held 1.5 times shorter) and right on the inputs a validation set of
standard normal samples holds, but off by 10% (alternating sign) on inputs whose mean magnitude
is above 2: what a precision route can do on data outside the range it was judged on (the
hold-out set's test case). ``kill_worker`` kills the process that started the trial's
process when the engine is loaded (SIGKILL to the parent: a Ray measure worker lost mid-trial;
never use it with the local executor, whose parent is the search itself), ``kill_worker_once``
does so only the first time for a trial (a marker under DOSSIER_FAULT_DIR remembers it).

Two more test-only knobs, both load-time (the engine is the baseline's, byte for byte), are the
timing calibration's ground truth. With ``pace=held`` every run busy-waits until 2.0 ms have
passed since it began; ``gain`` then shortens that hold by a known factor, so a route's true
speedup is known exactly: ``x1.25`` holds to 1.6 ms, ``x1.05`` to 2.0/1.05 ms, and ``aa`` to
2.0 ms (the default's twin under another name: an A/A route). A busy-wait rather than a sleep,
so that a loaded host delays it as it delays real work. Spec selection:
``-pace=held -gain=[none|x1.25]``.
"""

from __future__ import annotations

import os
import signal
import time
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
"""``fault=drift``: with ``pace=held``, runs held this many times shorter."""
DRIFT_RANGE = 2.0
"""``fault=drift``: outputs go wrong on inputs whose mean magnitude is above this (a standard
normal's is about 0.8)."""

PACE_MS = 2.0
"""What one run takes with ``pace=held`` and ``gain=none`` (the model's own time included)."""
GAINS = {"none": 1.0, "aa": 1.0, "x1.05": 1.05, "x1.25": 1.25}
"""``gain`` values and the factor by which each shortens the held run."""


def hold_ms(route: Route) -> float:
    """How long each run of ``route`` is held to (0: not held)."""
    values = route.as_dict()
    if values.get("pace", "off") != "held":
        return 0.0
    drift = DRIFT_GAIN if values.get("fault") == "drift" else 1.0
    return PACE_MS / GAINS.get(values.get("gain", "none"), 1.0) / drift


class _FaultyRunner(Runner):
    def __init__(self, inner: Runner, fault: str, pace_ms: float = 0.0) -> None:
        self._inner, self._fault, self._pace_s = inner, fault, pace_ms / 1000

    def run_impl(self, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        start = time.perf_counter()
        out = self._inner.run(inputs)
        while time.perf_counter() - start < self._pace_s:
            pass
        if self._fault == "nan":
            return {k: np.full_like(v, np.nan) for k, v in out.items()}
        if self._fault == "slow":
            time.sleep(0.002)
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
        pace = Knob(name="pace", values=("off", "held"), default="off", phase=KnobPhase.LOAD,
                    help=f"test-only: held, every run takes {PACE_MS} ms (busy-wait)")
        gain = Knob(name="gain", values=tuple(GAINS), default="none", phase=KnobPhase.LOAD,
                    help="test-only: with pace=held, shorten every run by this factor (the "
                         "calibration's ground truth: x1.25 is exactly 1.25 times as fast)")
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
                             route.as_dict().get("fault", "none"), hold_ms(route))

    def engine_facts(self, route: Route, db: KnobDatabase) -> dict[str, bool]:
        return super().engine_facts(_plain(route), db)


def _plain(route: Route) -> Route:
    """``route`` without the test-only knobs (what ONNX Runtime is given)."""
    return Route.of({k: v for k, v in route.values if k not in ("fault", "pace", "gain")})
