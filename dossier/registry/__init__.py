"""Bundles in OCI registries: push, pull verified on arrival, signatures as referrers.

A bundle is pushed as an OCI artifact of type ``application/vnd.dossier.bundle.v1``: its
``manifest.json`` as the config blob, each of its files as a layer (size and sha256, as the
distribution spec requires; xxh3-128 stays in dossier's own manifest). A ``dossier sign``
envelope is attached as an OCI 1.1 referrer of the bundle's manifest::

    from dossier.registry import fetch_bundle, pull_bundle, push_bundle

    pushed = push_bundle(Path("out/convnet-1.dossier"), "registry.example.com/ml/convnet:1",
                         signature=Path("out/convnet-1.dossier.sig.json"))
    print(pushed.reference)         # registry.example.com/ml/convnet@sha256:...
    pulled = pull_bundle(pushed.reference, Path("releases"))   # releases/convnet-1.dossier
    fetched = fetch_bundle("registry.example.com/ml/convnet:1")   # into the cache, + signatures

Needs the ``[oci]`` extra (oras-py). See :mod:`dossier.registry.artifact` for what pull checks.
"""

from __future__ import annotations

from dossier.registry.artifact import (
    ARTIFACT_TYPE,
    CACHE_ENV,
    CONFIG_TYPE,
    LAYER_TYPE,
    Pulled,
    Pushed,
    cache_dir,
    fetch_bundle,
    pull_bundle,
    push_bundle,
)
from dossier.registry.reference import Reference, is_loopback, looks_like_reference, parse_reference
from dossier.registry.referrers import SIGNATURE_TYPE, check_referrer_signatures

__all__ = [
    "ARTIFACT_TYPE",
    "CACHE_ENV",
    "CONFIG_TYPE",
    "LAYER_TYPE",
    "Pulled",
    "Pushed",
    "Reference",
    "SIGNATURE_TYPE",
    "cache_dir",
    "check_referrer_signatures",
    "fetch_bundle",
    "is_loopback",
    "looks_like_reference",
    "parse_reference",
    "pull_bundle",
    "push_bundle",
]
