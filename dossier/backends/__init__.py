"""Backends, by name. Each backend module imports its compiler lazily."""

from __future__ import annotations

import importlib
import os

from dossier.backends.interface import (
    Backend,
    BuildError,
    BuildInfo,
    EngineRuntimeError,
    LoadConfig,
    ModelSignature,
    Runner,
    TensorSpec,
)
from dossier.errors import SelectionError

_REGISTRY = {
    "onnxruntime": ("dossier.backends.onnxruntime", "OnnxRuntimeBackend"),
    "torch-inductor": ("dossier.backends.torch_inductor", "TorchInductorBackend"),
    "tensorrt": ("dossier.backends.tensorrt", "TensorRTBackend"),
}
TEST_BACKEND_ENV = "DOSSIER_TEST_BACKENDS"
"""Set to 1 to register the fault-injecting ``faulty`` backend (tests only)."""

__all__ = ["Backend", "BuildError", "BuildInfo", "EngineRuntimeError", "LoadConfig",
           "ModelSignature", "Runner",
           "TensorSpec", "backend_names", "get_backend"]


def backend_names() -> list[str]:
    """Names of the registered backends."""
    names = list(_REGISTRY)
    if os.environ.get(TEST_BACKEND_ENV) == "1":
        names.append("faulty")
    return names


def get_backend(name: str) -> Backend:
    """The backend called ``name`` (its compiler is not imported yet)."""
    if name == "faulty" and os.environ.get(TEST_BACKEND_ENV) == "1":
        from dossier.backends.faulty import FaultyBackend

        return FaultyBackend()
    try:
        module, cls = _REGISTRY[name]
    except KeyError:
        raise SelectionError(f"unknown backend {name!r}",
                             hint=f"use one of: {', '.join(_REGISTRY)}") from None
    return getattr(importlib.import_module(module), cls)()
