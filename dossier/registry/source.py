"""A verification's source when it is a registry reference: pulled into the cache (verified on
arrival) with its signature referrers, for :func:`dossier.verify.verify` and
:func:`dossier.load`."""

from __future__ import annotations

from pathlib import Path

from dossier.registry.artifact import Pulled, fetch_bundle
from dossier.registry.reference import looks_like_reference


def fetch_reference(source: str, *, insecure: bool = False, cache: Path | None = None,
                    require_signature: bool = False) -> Pulled | None:
    """``source`` pulled into the cache (or found intact there) with its signature referrers
    when it is a registry reference (``REGISTRY/REPO:TAG`` or ``REGISTRY/REPO@sha256:...``);
    None when it is not one (a local path, or text that is neither: opening it says what it is
    not). Raises the registry's errors (RegistryError, RegistryAuthError, NotFoundError) and
    BundleError for an artifact that is not an intact dossier bundle. A malformed signature
    referrer is refused under ``require_signature`` and otherwise named in
    ``Pulled.warnings`` and ignored."""
    if Path(source).exists() or not looks_like_reference(source):
        return None
    return fetch_bundle(source, insecure=insecure, cache=cache,
                        require_signature=require_signature)


__all__ = ["fetch_reference"]
