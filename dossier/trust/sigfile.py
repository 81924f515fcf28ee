"""Where a bundle's signature lives: a file beside the bundle, named after it.

Kept apart from :mod:`dossier.trust.signing` (keys, DSSE envelopes, in-toto statements), so that a
command learns whether a bundle is signed without importing the signing machinery.
"""

from __future__ import annotations

from pathlib import Path

SIGNATURE_SUFFIX = ".dossier.sig.json"
"""A bundle ``NAME-VERSION.dossier`` (or ``.dossier.tar``) is signed by ``NAME-VERSION.dossier.sig.json``."""


def signature_path(bundle: Path) -> Path:
    """Where the signature of the bundle folder or archive ``bundle`` lives by default."""
    bundle = Path(bundle)
    name = bundle.name
    for suffix in (".dossier.tar", ".dossier"):
        if name.endswith(suffix) and len(name) > len(suffix):
            return bundle.with_name(name[: -len(suffix)] + SIGNATURE_SUFFIX)
    return bundle.with_name(name + ".sig.json")


__all__ = ["SIGNATURE_SUFFIX", "signature_path"]
