"""A test-only backend: ONNX Runtime plus the knobs of a synthetic landscape
(:mod:`dossier_test_backends.landscape.space`, 30 knobs from seed 0), whose true speedups, failures
and optimum are known.

Registered for the test suite only (``tests/plugins``: see :mod:`dossier_test_backends`) and
marked ``for_tests``. A route's
engine is the baseline's ONNX Runtime engine; every run busy-waits until ``PACE_MS`` x the
landscape's relative run time of the route has passed since it began (as the ``faulty``
backend's ``pace=held``), so a real search over it times real processes against a known truth.
A route in a region that fails to build raises a build error; one in a region that breaks
accuracy returns outputs shifted far beyond any threshold.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from dossier.backends.interface import BuildError, BuildInfo, Runner
from dossier.backends.onnxruntime import OnnxRuntimeBackend
from dossier.knobs import KnobDatabase, KnobPhase
from dossier.routes import Route
from dossier_test_backends.landscape.space import Landscape, knob_database

PACE_MS = 2.0
"""What one run of the baseline takes (the model's own time included)."""
LANDSCAPE = Landscape.generate(knobs=30, seed=0)
"""The landscape this backend's knobs follow."""


def hold_ms(route: Route) -> float:
    """How long each run of ``route`` is held to."""
    return PACE_MS * LANDSCAPE.time(_values(route))


def _values(route: Route) -> dict[str, str]:
    return {k: v for k, v in route.values if k in LANDSCAPE.values}


class _HeldRunner(Runner):
    def __init__(self, inner: Runner, pace_ms: float, broken: bool) -> None:
        self._inner, self._pace_s, self._broken = inner, pace_ms / 1000, broken

    def run_impl(self, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        start = time.perf_counter()
        out = self._inner.run(inputs)
        while time.perf_counter() - start < self._pace_s:
            pass
        if self._broken:  # an accuracy failure: outputs far from the references
            return {k: v + np.ones_like(v) * 1e3 for k, v in out.items()}
        return out

    def close_impl(self) -> None:
        self._inner.close()


class LandscapeBackend(OnnxRuntimeBackend):
    """ONNX Runtime with a synthetic landscape's knobs (tests and benchmarks only)."""

    name = "landscape"
    for_tests = True

    def knob_database_impl(self) -> KnobDatabase:
        db = super().knob_database_impl()
        own = knob_database(LANDSCAPE, self.name).knobs
        return db.model_copy(update={"backend": self.name, "knobs": (*own, *db.knobs)})

    def _options(self, route: Route, phase: KnobPhase | None) -> tuple[Any, list[str]]:
        return super()._options(_plain(route), phase)

    def build_impl(self, model: Path, route: Route, engine: Path) -> BuildInfo:
        if LANDSCAPE.feasibility(_values(route)) == "build_failed":
            raise BuildError("the landscape's knobs fail to build together")
        return super().build_impl(model, route, engine)

    def load_impl(self, engine: Path, route: Route) -> Runner:
        return _HeldRunner(super().load_impl(engine, route), hold_ms(route),
                           LANDSCAPE.feasibility(_values(route)) == "rejected")

    def engine_facts(self, route: Route, db: KnobDatabase) -> dict[str, bool]:
        return super().engine_facts(_plain(route), db)


def _plain(route: Route) -> Route:
    """``route`` without the landscape's knobs (what ONNX Runtime is given)."""
    return Route.of({k: v for k, v in route.values if k not in LANDSCAPE.values})
