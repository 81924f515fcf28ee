"""Backends, by name: one package per backend (``dossier/backends/<name>/``: knobs, build,
runner, fingerprint facts, verify policy rules), found through the ``dossier.backends`` entry
points of the installed distributions (dossier's own in pyproject.toml; a plug-in package
declares its own; the test-only backends are registered by tests/plugins for the test suite
alone). Nothing is imported until a backend is asked for, and a backend imports its compiler
lazily, so ``import dossier`` imports neither torch nor onnxruntime.
"""

from __future__ import annotations

from dossier.backends.interface import (
    Backend,
    BuildError,
    BuildInfo,
    EngineRuntimeError,
    LoadConfig,
    ModelSignature,
    Runner,
    SearchTraits,
    TensorSpec,
)
from dossier.backends.registry import (
    ENTRY_POINT_GROUP,
    backend_names,
    default_policy,
    get_backend,
    not_served,
    register_backend,
    requirement_findings,
    unregister_backend,
)

__all__ = ["ENTRY_POINT_GROUP", "Backend", "BuildError", "BuildInfo", "EngineRuntimeError",
           "LoadConfig", "ModelSignature", "Runner", "SearchTraits", "TensorSpec", "backend_names",
           "default_policy", "get_backend", "not_served", "register_backend",
           "requirement_findings", "unregister_backend"]
