"""A test-only backend for the reliability tests: ONNX Runtime plus two knobs. Not collected.

- ``pace``: ``slow`` (the default) sleeps 10 ms in every inference, ``brisk`` 1 ms, ``fast``
  not at all; a timed inference reads 10, 1 or 0.5 ms on the ``faulty`` backend's simulated
  clock (:class:`dossier_test_backends.faulty.backend.Clock`), whatever the host's load made of the
  sleep and the model. The baseline (each varied knob at its default) is therefore far slower
  than a ``brisk`` or ``fast`` route on any host, so a search has candidates, runs its
  confirmation round and ships a gain.
- ``hazard``: breaks the trial's process for real *after* the engine was built, where
  ``dossier_test_backends.faulty`` breaks it during the build: ``segv_load``, ``abort_load``,
  ``oom_load`` (allocates until the address-space limit stops it), ``raise_load`` (the engine
  does not load), ``segv_run``, ``oom_run``, ``hang_run``, ``raise_run`` (the first inference
  crashes, exhausts memory, hangs or fails), ``segv_time``, ``oom_time`` (the 10th inference,
  i.e. while timing, after validation passed).

Child processes find it as a plug-in would be found: :func:`install` writes a distribution's
metadata declaring it in the ``dossier.backends`` entry-point group into a folder the tests put
first on PYTHONPATH; this process registers it with :func:`dossier.backends.register_backend`.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Mapping
from pathlib import Path

import numpy as np
from dossier_test_backends.faulty.backend import Clock

from dossier.backends.interface import EngineRuntimeError, Runner
from dossier.backends.onnxruntime import OnnxRuntimeBackend
from dossier.knobs import Knob, KnobDatabase, KnobPhase
from dossier.routes import Route

NAME = "stress"
PACES = {"slow": 0.010, "brisk": 0.001}
CLOCKED_MS = {"slow": 10.0, "brisk": 1.0, "fast": 0.5}
"""What a timed inference of each ``pace`` reads on the simulated clock."""
HAZARDS = ("none", "segv_load", "abort_load", "oom_load", "raise_load", "segv_run", "oom_run",
           "hang_run", "raise_run", "segv_time", "oom_time")
TARGET = "tests._stress_backend:StressBackend"


def install(site: Path) -> None:
    """Declare the backend in ``site`` (a folder on the path) as an installed distribution's
    ``dossier.backends`` entry point, so every Python process with ``site`` on its path finds it."""
    meta = site / "dossier_stress_backend-0.dist-info"
    meta.mkdir(parents=True, exist_ok=True)
    (meta / "METADATA").write_text("Metadata-Version: 2.1\nName: dossier-stress-backend\n"
                                   "Version: 0\n")
    (meta / "entry_points.txt").write_text(f"[dossier.backends]\n{NAME} = {TARGET}\n")


def _break(how: str) -> None:
    if how == "segv":
        os.kill(os.getpid(), signal.SIGSEGV)
    if how == "abort":
        os.abort()
    if how == "oom":
        hog = []
        while True:
            hog.append(bytearray(256 << 20))
    if how == "hang":
        while True:
            time.sleep(60)
    if how == "raise":
        raise EngineRuntimeError(f"injected {how} failure")


class _StressRunner(Runner):
    def __init__(self, inner: Runner, route: Route, pace: str, hazard: str) -> None:
        self._inner, self._pace, self._hazard, self._calls = inner, pace, hazard, 0
        self._clock = Clock(route, CLOCKED_MS[pace])

    def timed_impl(self, prepared: object) -> float:
        self.run_impl(prepared)  # type: ignore[arg-type]
        return self._clock()

    def run_impl(self, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        self._calls += 1
        how, _, when = self._hazard.partition("_")
        if when == "run" or (when == "time" and self._calls >= 10):
            _break(how)
        if self._pace in PACES:
            time.sleep(PACES[self._pace])
        return self._inner.run(inputs)


class StressBackend(OnnxRuntimeBackend):
    """ONNX Runtime with a slow default pace and post-build hazards (tests only)."""

    name = NAME

    for_tests = True

    def knob_database_impl(self) -> KnobDatabase:
        db = super().knob_database_impl()
        extra = (Knob(name="pace", values=("slow", "brisk", "fast"), default="slow",
                      phase=KnobPhase.LOAD, help="test-only: sleep per inference (10, 1, 0 ms)"),
                 Knob(name="hazard", values=HAZARDS, default="none", phase=KnobPhase.LOAD,
                      help="test-only: break the trial's process after the build"))
        return db.model_copy(update={"backend": self.name, "knobs": (*extra, *db.knobs)})

    def load_impl(self, engine: Path, route: Route) -> Runner:
        values = route.as_dict()
        hazard = values.get("hazard", "none")
        how, _, when = hazard.partition("_")
        if when == "load":
            _break(how)
        return _StressRunner(super().load_impl(engine, route), route, values.get("pace", "slow"),
                             hazard)
