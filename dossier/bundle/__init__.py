"""Release bundles (format ``dossier-bundle`` 1.0): write, open, check, pack.

A bundle is a folder ``NAME-VERSION.dossier/`` (or one deterministic ``.dossier.tar``) holding
the shipped engine, the baseline engine, the model's identity (and the model), the knob
database, every trial (routes.parquet), every raw timing sample (timings.parquet), the shape
distribution (shapes.parquet), the validation set, the tuning cache and the tuning host's
fingerprint, with a manifest that lists every file's size and xxh3-128::

    from dossier.bundle import check_integrity, open_bundle, write_bundle

    written = write_bundle(Path("runs/convnet-1"), Path("releases"))
    with open_bundle(written.path) as bundle:          # a folder or a .dossier.tar
        report = check_integrity(bundle)
        assert report, report                          # names each missing/extra/altered file
        print(bundle.manifest.summary.result)          # "1.234x [1.200, 1.270] (p=0.001)"
        routes = bundle.routes()                       # a pyarrow Table, one row per trial
"""

from __future__ import annotations

import importlib as _importlib
import typing as _typing

if _typing.TYPE_CHECKING:  # the names below load with their module on first use (fast commands)
    from dossier.bundle.archive import extract_archive
    from dossier.bundle.builder import (
        BundleContent,
        WrittenBundle,
        build_bundle,
        bundle_name,
        check_target,
    )
    from dossier.bundle.integrity import IntegrityReport, Problem, ProblemKind, check_integrity
    from dossier.bundle.manifest import (
        FORMAT,
        FORMAT_VERSION,
        READABLE_MAJORS,
        EngineEntry,
        Engines,
        ExternalFile,
        FileEntry,
        Manifest,
        ModelIdentity,
        Summary,
        ValidationInfo,
        parse_manifest,
    )
    from dossier.bundle.model import model_identity
    from dossier.bundle.overview import Overview
    from dossier.bundle.pack import archive_name, pack_bundle, write_archive
    from dossier.bundle.reader import Bundle, open_bundle, read_bundle
    from dossier.bundle.writer import coverage_warnings, write_bundle

_FROM = {
    "archive": ("extract_archive",),
    "builder": ("BundleContent", "WrittenBundle", "build_bundle", "bundle_name", "check_target"),
    "integrity": ("IntegrityReport", "Problem", "ProblemKind", "check_integrity"),
    "manifest": ("FORMAT", "FORMAT_VERSION", "READABLE_MAJORS", "EngineEntry", "Engines",
                 "ExternalFile", "FileEntry", "Manifest", "ModelIdentity", "Summary",
                 "ValidationInfo", "parse_manifest"),
    "model": ("model_identity",),
    "overview": ("Overview",),
    "pack": ("archive_name", "pack_bundle", "write_archive"),
    "reader": ("Bundle", "open_bundle", "read_bundle"),
    "writer": ("coverage_warnings", "write_bundle"),
}
"""Where each public name lives: a command that only verifies never loads the writer."""
_MODULE = {name: module for module, names in _FROM.items() for name in names}


def __getattr__(name: str) -> _typing.Any:
    module = _MODULE.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(_importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value


__all__ = [
    "archive_name",
    "build_bundle",
    "Bundle",
    "bundle_name",
    "BundleContent",
    "check_integrity",
    "check_target",
    "coverage_warnings",
    "EngineEntry",
    "Engines",
    "ExternalFile",
    "extract_archive",
    "FileEntry",
    "FORMAT",
    "FORMAT_VERSION",
    "IntegrityReport",
    "Manifest",
    "model_identity",
    "ModelIdentity",
    "open_bundle",
    "Overview",
    "pack_bundle",
    "parse_manifest",
    "Problem",
    "ProblemKind",
    "read_bundle",
    "READABLE_MAJORS",
    "Summary",
    "ValidationInfo",
    "write_archive",
    "write_bundle",
    "WrittenBundle",
]
