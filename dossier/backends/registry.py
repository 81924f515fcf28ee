"""The backend registry: backends by name, from this process's registrations and the
``dossier.backends`` entry points of the installed distributions."""

from __future__ import annotations

import functools
import importlib
from collections.abc import Callable
from typing import TYPE_CHECKING

from dossier.backends.interface import (
    Backend,
)
from dossier.errors import BackendUnavailableError, InputError, SelectionError

if TYPE_CHECKING:
    from dossier.fingerprint import Fingerprint
    from dossier.host.policy import Finding, Policy

ENTRY_POINT_GROUP = "dossier.backends"
"""The entry-point group a backend is registered in: ``name = "package.module:BackendClass"``."""

Factory = Callable[[], Backend]
_REGISTERED: dict[str, Factory | str] = {}
"""Backends registered in this process by :func:`register_backend` (ahead of entry points)."""


@functools.cache
def _entry_points() -> dict[str, str]:
    """name -> ``module:Class`` of every ``dossier.backends`` entry point (the first
    distribution on the path wins a name), read once per process."""
    from importlib import metadata  # ~0.1 s of imports: only when a backend is looked up

    found: dict[str, str] = {}
    for ep in metadata.entry_points(group=ENTRY_POINT_GROUP):
        found.setdefault(ep.name, ep.value)
    return found


def register_backend(name: str, backend: Factory | str) -> None:
    """Make a backend known in this process under ``name``: a zero-argument factory (e.g. the
    class) or a ``module:Class`` reference, imported when first asked for. Child processes
    (trials) do not see it: they find backends through entry points."""
    _REGISTERED[name] = backend


def unregister_backend(name: str) -> None:
    """Forget a backend :func:`register_backend` registered (no-op when it did not)."""
    _REGISTERED.pop(name, None)


def _known() -> dict[str, Factory | str]:
    return {**_entry_points(), **_REGISTERED}


def backend_names(*, include_tests: bool = False) -> list[str]:
    """Names of the registered backends; test-only backends (``for_tests``) only when asked.
    Telling those apart imports each backend's package (never its compiler)."""
    names = sorted(_known())
    if include_tests:
        return names
    return [n for n in names if _shipped(n)]


def _shipped(name: str) -> bool:
    try:
        return not get_backend(name).for_tests
    except BackendUnavailableError:  # registered, but its package is not there
        return False


def not_served(name: str, backend: Backend | None) -> str | None:
    """Why a bundle naming the backend ``name`` is never served here (None: it may be);
    ``backend`` is the instance :func:`get_backend` made for it, None when the name is not
    known here. A test-only backend (``for_tests``: ``faulty`` and ``landscape``, registered
    for dossier's test suite alone, break processes on purpose) is never served, wherever it
    is registered."""
    if backend is None:
        return (f"{name!r} is not a shipped backend: this installation does not know it "
                f"(known: {', '.join(backend_names()) or 'none'})")
    if backend.for_tests:
        return f"{name!r} is not a shipped backend: a test-only one, never served from a bundle"
    return None


def _load(name: str, target: Factory | str) -> Backend:
    factory: object = target
    if isinstance(target, str):
        module, _, attr = target.partition(":")
        try:
            factory = getattr(importlib.import_module(module), attr)
        except (ImportError, AttributeError) as exc:  # a stale or broken registration
            raise BackendUnavailableError(
                f"backend {name!r} is registered as {target!r}, which does not import here "
                f"({type(exc).__name__}: {exc})", hint="reinstall the package that "
                "registers it (pip install -e . in a source tree)") from exc
    backend = factory() if callable(factory) else None
    if not isinstance(backend, Backend):
        raise TypeError(f"backend {name!r} ({target!r}) is not a dossier Backend")
    return backend


def get_backend(name: str) -> Backend:
    """A fresh instance of the backend called ``name`` (its compiler is not imported yet)."""
    known = _known()
    if name not in known:
        hint = (f"use one of: {', '.join(backend_names())}" if known else
                "no backend is registered: dossier is not installed (pip install -e . in a "
                "source tree registers its entry points)")
        raise SelectionError(f"unknown backend {name!r}", hint=hint)
    return _load(name, known[name])


def default_policy(backend: str) -> Policy:
    """The built-in verify policy of ``backend``'s engines (:meth:`Backend.default_policy`)."""
    if backend not in _known():
        raise InputError(f"no verify policy for backend {backend!r}; known: "
                         f"{', '.join(backend_names())}")
    return get_backend(backend).default_policy()


def requirement_findings(backend: str, host: Fingerprint) -> list[Finding]:
    """What an engine of ``backend`` needs on any host (:meth:`Backend.requirement_findings`);
    none for a backend not known here."""
    if backend not in _known():
        return []
    return get_backend(backend).requirement_findings(host)
