"""The backend interface: one compiler behind ``knob_database / build / load``.

A backend imports its compiler lazily (inside methods), so a host without it can still read,
verify and explain bundles made with it. Public methods check their inputs and call the
``*_impl`` methods subclasses provide; native compiler errors are mapped to dossier errors at
this boundary.
"""

from __future__ import annotations

import abc
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from dossier.errors import BackendUnavailableError, InputError, ValidationSetError
from dossier.knobs import KnobDatabase
from dossier.routes import Route


class BuildError(Exception):
    """The compiler failed to build a route (a ``build_failed`` trial outcome, not a tool error)."""


class EngineRuntimeError(Exception):
    """A built engine failed to load or run (a ``runtime_error`` trial outcome)."""


@dataclass(frozen=True)
class TensorSpec:
    """Name, element type and shape of a model input or output (None or a name = dynamic)."""

    name: str
    dtype: str
    shape: tuple[int | str | None, ...]

    def accepts(self, array: np.ndarray) -> str | None:
        """None when ``array`` fits; else what does not fit."""
        if str(array.dtype) != self.dtype:
            return f"dtype {array.dtype}, model expects {self.dtype}"
        if len(array.shape) != len(self.shape):
            return f"rank {array.ndim} (shape {tuple(array.shape)}), model expects {self.shape}"
        for got, want in zip(array.shape, self.shape):
            if isinstance(want, int) and got != want:
                return f"shape {tuple(array.shape)}, model expects {self.shape}"
        return None


@dataclass(frozen=True)
class ModelSignature:
    """The inputs and outputs of a model."""

    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]

    def check_pair(self, pair_name: str, inputs: Mapping[str, np.ndarray],
                   references: Mapping[str, np.ndarray]) -> None:
        """Raise ValidationSetError when a pair's names, dtypes or shapes do not fit the model."""
        want_in = {t.name: t for t in self.inputs}
        want_out = {t.name: t for t in self.outputs}
        if set(inputs) != set(want_in):
            raise ValidationSetError(
                f"{pair_name}: inputs {sorted(inputs)} do not match the model's {sorted(want_in)}")
        unknown = sorted(set(references) - set(want_out))
        if unknown or not references:
            raise ValidationSetError(
                f"{pair_name}: references {sorted(references)} do not match the model's outputs "
                f"{sorted(want_out)}")
        for name, arr in inputs.items():
            problem = want_in[name].accepts(arr)
            if problem:
                raise ValidationSetError(f"{pair_name}: input {name!r} has {problem}")
        for name, arr in references.items():
            spec = want_out[name]
            if len(arr.shape) != len(spec.shape):
                raise ValidationSetError(
                    f"{pair_name}: reference {name!r} has shape {tuple(arr.shape)}, model output "
                    f"is {spec.shape}")


@dataclass
class BuildInfo:
    """What a build reports besides the engine file."""

    facts: dict[str, str] = field(default_factory=dict)
    """Backend facts about the engine (e.g. plan header fields, the ISA it targets)."""


class LoadConfig(BaseModel):
    """How production should load a shipped engine: the configuration dossier timed it in."""

    model_config = ConfigDict(frozen=True, extra="forbid", use_attribute_docstrings=True)

    call: str
    """The loader call, in the backend's Python API, with ``ENGINE`` for the engine's path."""
    options: dict[str, str] = Field(default_factory=dict)
    """Options set on top of the library's defaults (e.g. ORT session options), by name."""
    environment: dict[str, str] = Field(default_factory=dict)
    """Environment variables the loading process needs."""
    note: str = ""
    """What else to know (e.g. what the options are for)."""
    snippet: str = ""
    """A few lines of Python that load the engine this way."""


class Runner(abc.ABC):
    """A loaded engine."""

    @abc.abstractmethod
    def run(self, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Run once; return host arrays."""

    def prepare(self, inputs: Mapping[str, np.ndarray]) -> object:
        """Turn host inputs into whatever :meth:`timed` consumes (e.g. device buffers)."""
        return inputs

    def timed(self, prepared: object) -> float:
        """Run once on prepared inputs and return the latency in milliseconds. The default
        times ``run`` with ``perf_counter_ns``; device backends override it with events."""
        import time

        t0 = time.perf_counter_ns()
        self.run(prepared)  # type: ignore[arg-type]
        return (time.perf_counter_ns() - t0) / 1e6

    def close(self) -> None:
        """Release the engine."""

    def __enter__(self) -> Runner:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class Backend(abc.ABC):
    """A compiler dossier can tune."""

    name: ClassVar[str]
    """Registered name, e.g. ``onnxruntime``."""
    engine_suffix: ClassVar[str]
    """File suffix of the engine artifact, e.g. ``.ort``."""
    requirement: ClassVar[str]
    """What to install for this backend, for error messages."""
    reload_per_block: ClassVar[bool] = False
    """Load the engine afresh for every timing block and release it after, so only one engine
    is alive at a time (two ONNX Runtime sessions in one process disturb each other through
    their thread pools); otherwise both engines stay loaded for the whole trial."""
    separate_build: ClassVar[bool] = False
    """Build in one process and load, validate and time in a fresh one (as a deployment
    loads a shipped engine): for compilers whose in-process state can disturb the engine."""

    def configure(self, options: Mapping[str, object], shapes: list) -> None:
        """Apply the spec's ``[builder]`` options and shape distribution (``[[shapes]]``).

        Backends without builder options refuse any; shapes are ignored unless the backend
        builds for a shape range (TensorRT optimization profiles)."""
        if options:
            raise InputError(f"backend {self.name} takes no [builder] options "
                             f"(got {', '.join(sorted(options))})")

    def require(self) -> None:
        """Raise BackendUnavailableError with an install hint when the library is missing."""
        if not self.available():
            raise BackendUnavailableError(
                f"backend {self.name} needs a library that is not installed on this host",
                hint=f"install it: {self.requirement}")

    @abc.abstractmethod
    def available(self) -> bool:
        """True when the compiler library can be imported here (without importing it)."""

    @abc.abstractmethod
    def knob_database(self) -> KnobDatabase:
        """Every knob this backend exposes on this host."""

    @abc.abstractmethod
    def signature(self, model: Path) -> ModelSignature:
        """The model's inputs and outputs; ModelError when the model cannot be read."""

    def check_route(self, model: Path, route: Route, db: KnobDatabase) -> None:
        """Raise SelectionError when a knob of ``route`` is known not to take effect."""

    @abc.abstractmethod
    def build(self, model: Path, route: Route, engine: Path) -> BuildInfo:
        """Compile ``model`` under ``route`` into the file ``engine``; BuildError on failure."""

    @abc.abstractmethod
    def load(self, engine: Path, route: Route) -> Runner:
        """Load a built engine (load-time knobs of ``route`` applied); EngineRuntimeError on failure."""

    def production_load(self, route: Route, db: KnobDatabase) -> LoadConfig:
        """The load configuration a deployment should use for an engine built with ``route``:
        the one :meth:`load` times it in. The default: the backend's own ``load``."""
        return LoadConfig(call=f"dossier.backends.get_backend({self.name!r}).load(ENGINE, route)",
                          note="no production loader is documented for this backend")

    def engine_facts(self, route: Route, db: KnobDatabase) -> dict[str, bool]:
        """Boolean facts about an engine built with ``route`` that the verify policy uses."""
        return {}

    def stack(self) -> dict[str, str]:
        """Versions of the libraries this backend runs on (recorded in the tuning cache)."""
        return {}
