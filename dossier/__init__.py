"""dossier: tune compiled inference engines, bundle them with their evidence, verify them on
target hosts, and explain why a build route was chosen.

``dossier.load(source, ...)`` verifies a bundle and loads its engine as it was timed (see
:mod:`dossier.serve`); it is imported on first use, so ``import dossier`` stays cheap."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from dossier.version import __version__

if TYPE_CHECKING:
    from dossier.serve import Engine, load


def __getattr__(name: str) -> Any:
    if name in ("load", "Engine"):
        from dossier import serve

        return getattr(serve, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["Engine", "__version__", "load"]
