"""A test-only backend: ONNX Runtime plus a ``fault`` knob that really breaks the trial's process.

Registered through the ``dossier.backends`` entry points and marked ``for_tests`` (left out of
the backend names offered to users). The faults are
real: ``abort`` calls os.abort() (SIGABRT), ``segv`` sends SIGSEGV to the process, ``hang``
sleeps forever, ``oom`` allocates until the memory limit stops it, ``raise`` fails the build,
``nan`` makes every output NaN, ``slow`` sleeps 2 ms per run. ``kill_worker`` kills the process that started the trial's
process when the engine is loaded (SIGKILL to the parent: a Ray measure worker lost mid-trial;
never use it with the local executor, whose parent is the search itself), ``kill_worker_once``
does so only the first time for a trial (a marker under DOSSIER_FAULT_DIR remembers it).
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
          "kill_worker_once")


class _FaultyRunner(Runner):
    def __init__(self, inner: Runner, fault: str) -> None:
        self._inner, self._fault = inner, fault

    def run_impl(self, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        out = self._inner.run(inputs)
        if self._fault == "nan":
            return {k: np.full_like(v, np.nan) for k, v in out.items()}
        if self._fault == "slow":
            time.sleep(0.002)
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
        return db.model_copy(update={"backend": self.name, "knobs": (fault, *db.knobs)})

    def _options(self, route: Route, phase: KnobPhase | None) -> tuple[Any, list[str]]:
        return super()._options(Route.of({k: v for k, v in route.values if k != "fault"}), phase)

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
        return _FaultyRunner(super().load_impl(engine, route), route.as_dict().get("fault", "none"))

    def engine_facts(self, route: Route, db: KnobDatabase) -> dict[str, bool]:
        return super().engine_facts(Route.of({k: v for k, v in route.values if k != "fault"}), db)
