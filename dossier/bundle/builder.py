"""The one bundle builder: a :class:`BundleContent` in, ``DIR/NAME-VERSION.dossier`` out.

Whatever a bundle comes from (a finished run folder, :mod:`dossier.bundle.writer`; a trtexec
tuning cache, :mod:`dossier.backends.tensorrt.importer`), it is first described as a
:class:`BundleContent` (everything checked, nothing written), then :func:`build_bundle` writes it: the bundle is
staged in a folder next to the target (``DIR/.NAME-VERSION.dossier.staging-*``, same file
system), every file is written, fsynced and hashed as it is written (a copied file is checked
against the digest recorded for it), ``model.json`` is made from the model files as copied, the
manifest is sealed and written last, and the staging folder is renamed into place without
replacing anything. A killed writer leaves only a staging folder, which the next write to the
same folder removes; no half-written bundle is ever visible at ``DIR/NAME-VERSION.dossier``.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow as pa

from dossier.bundle import tables
from dossier.bundle.manifest import (
    BUNDLE_SUFFIX,
    FORMAT_VERSION,
    MANIFEST_NAME,
    MODEL_JSON,
    EngineEntry,
    Engines,
    ExternalFile,
    FileEntry,
    Manifest,
    ModelIdentity,
    Summary,
    manifest_bytes,
    seal,
)
from dossier.diskfull import output_error
from dossier.errors import DossierError, ModelError, OutputError
from dossier.files import (
    begin_staging,
    copy_file_hashed,
    fsync_path,
    fsync_tree,
    rename_noreplace,
    write_durable,
)
from dossier.hashing import digest_file
from dossier.knobs import KnobDatabase
from dossier.load_config import LoadConfig
from dossier.spec import ShapeEntry
from dossier.trial import TrialRecord
from dossier.version import __version__

logger = logging.getLogger(__name__)


# ----------------------------------------------------------------------------------- content
@dataclass(frozen=True)
class Copy:
    """A file copied into the bundle verbatim."""

    src: Path
    """Where it is now."""
    rel: str
    """Its bundle path."""
    expect: str | None = None
    """The xxh3-128 it must have (recorded when it was made); None: whatever it holds."""
    changed: DossierError | None = None
    """Raised when the copy's digest is not ``expect``."""


@dataclass(frozen=True)
class Data:
    """A file of the bundle made in memory (a JSON document, a rewritten record)."""

    rel: str
    """Its bundle path."""
    data: bytes
    """Its content."""


@dataclass(frozen=True)
class Table:
    """A Parquet table of the bundle (:mod:`dossier.bundle.tables`)."""

    rel: str
    """Its bundle path."""
    table: pa.Table
    """Its rows."""


def trial_tables(trials: Sequence[TrialRecord], knobs: Sequence[str], db: KnobDatabase,
                 shipped_index: int, shapes: Sequence[ShapeEntry]) -> list[Table]:
    """The tables every bundle carries: its routes, its raw timings and its shape
    distribution."""
    return [Table(tables.ROUTES, tables.routes_table(trials, knobs, db, shipped_index)),
            Table(tables.TIMINGS, tables.timings_table(trials)),
            Table(tables.SHAPES, tables.shapes_table(shapes))]


@dataclass(frozen=True)
class EngineFile:
    """An engine and what its manifest entry says besides size and digest."""

    file: Copy
    """The engine file (``expect``: the digest the search recorded, or hashed at import)."""
    route: str
    """Its build route."""
    trial_index: int
    """The trial that built it."""
    facts: dict[str, str] = field(default_factory=dict)
    """What the backend reported about it."""
    flags: dict[str, bool] = field(default_factory=dict)
    """Boolean facts the verify policy uses."""
    load: LoadConfig | None = None
    """How production loads it."""


@dataclass(frozen=True)
class ModelFiles:
    """The model at hand: its file and its external data files, copied when ``include``."""

    path: Path
    """The model file."""
    include: bool
    """Copy it (and its external data) into ``model/``; else only hash it."""
    externals: Sequence[str] = ()
    """Locations of its external data files, relative to its folder."""
    expect: str | None = None
    """The xxh3-128 the search recorded for the model file."""
    changed: DossierError | None = None
    """Raised when the model file's digest is not ``expect``."""


@dataclass(frozen=True)
class BundleContent:
    """Everything a bundle is made of, checked, nothing written yet: what a finished run and a
    trtexec import both produce, and all :func:`build_bundle` needs."""

    release: str
    """NAME."""
    release_version: int
    """VERSION."""
    description: str
    """One line about the release."""
    parent: str | None
    """The dossier id of the bundle this one re-tunes."""
    created_at: str
    """When the search finished (ISO 8601), or ``unknown``."""
    backend: str
    """Compiler backend."""
    tuner_version: str
    """The backend's tuner version."""
    knob_db_digest: str
    """xxh3-128 of the knob database."""
    summary: Summary
    """The decision and its figures."""
    shipped: EngineFile
    """The engine to deploy."""
    baseline: EngineFile | None
    """The baseline's engine; None when the bundle has none (or it is the shipped one)."""
    baseline_is_shipped: bool
    """The baseline ships: the manifest's baseline entry is the shipped one."""
    model: ModelFiles | ModelIdentity
    """The model files, or only its identity when it is not at hand."""
    files: Sequence[Copy | Data | Table]
    """Every other file, in the order they are written."""
    tuning_host: Mapping[str, str] = field(default_factory=dict)
    """A summary of the tuning host."""
    warnings: Sequence[str] = ()
    """What is questionable about the bundle."""

    @property
    def name(self) -> str:
        """``NAME-VERSION.dossier``."""
        return bundle_name(self.release, self.release_version)


def trial_counts(trials: Iterable[TrialRecord]) -> dict[str, int]:
    """Trials by outcome (confirmation re-measurements left out), sorted by outcome."""
    counts: dict[str, int] = {}
    for t in trials:
        if t.role != "confirm":
            counts[t.outcome.value] = counts.get(t.outcome.value, 0) + 1
    return dict(sorted(counts.items()))


def json_bytes(data: object) -> bytes:
    """How the bundle's JSON documents are stored: indented, sorted keys, trailing newline."""
    return (json.dumps(data, indent=2, sort_keys=True, allow_nan=False) + "\n").encode()


# ------------------------------------------------------------------------------------ target
@dataclass(frozen=True)
class WrittenBundle:
    """A bundle just written."""

    path: Path
    """The bundle folder ``DIR/NAME-VERSION.dossier``."""
    manifest: Manifest
    """Its manifest."""


def bundle_name(release: str, version: int) -> str:
    """``NAME-VERSION.dossier``."""
    return f"{release}-{version}{BUNDLE_SUFFIX}"


def check_target(out_dir: Path, release: str, version: int) -> Path:
    """The bundle folder a release would be written to; OutputError when it exists or when
    ``out_dir`` holds the same release at a version as high or higher. Writes nothing."""
    out_dir = Path(out_dir)
    target = out_dir / bundle_name(release, version)
    if os.path.lexists(target):
        raise OutputError(f"{target} exists already",
                          hint="bundles are never overwritten; raise the release version")
    pattern = re.compile(rf"^{re.escape(release)}-(\d+)(\.dossier|\.dossier\.tar)$")
    try:
        names = sorted(p.name for p in out_dir.iterdir()) if out_dir.is_dir() else []
    except OSError as exc:
        raise OutputError(f"cannot list {out_dir}: {exc.strerror}") from exc
    held = [(int(m[1]), n) for n in names if (m := pattern.match(n))]
    newer = [(v, n) for v, n in held if v >= version]
    if newer:
        v, _ = max(newer)
        raise OutputError(f"release versions must increase; {out_dir} holds {release}-{v}",
                          hint=f"set [release] version above {v} in the release spec")
    return target


# ------------------------------------------------------------------------------------- build
def build_bundle(content: BundleContent, out_dir: Path) -> WrittenBundle:
    """Write ``content`` as ``out_dir/NAME-VERSION.dossier``, atomically (see the module doc).
    OutputError when the target exists, the release version does not increase or ``out_dir``
    cannot be written; DiskFullError (exit 74) when its file system is full; the content's own
    error when a file changed since it was described."""
    target = check_target(out_dir, content.release, content.release_version)
    return commit_bundle(Path(out_dir), target, lambda staging: _Build(staging).run(content))


def commit_bundle(out_dir: Path, target: Path,
                  fill: Callable[[Path], Manifest]) -> WrittenBundle:
    """Write a bundle folder atomically: ``fill(staging)`` writes every file into a staging
    folder next to ``target`` (the manifest last) and returns the manifest; the folder is then
    fsynced and renamed into place without replacing anything. A staging folder left by a
    killed writer in ``out_dir`` is removed first; on any failure the staging folder goes.
    OutputError when ``out_dir`` cannot be written or ``target`` appeared meanwhile."""
    out_dir = Path(out_dir)
    staging = begin_staging(out_dir, target.name, directory=True)
    try:
        manifest = fill(staging)
        fsync_tree(staging)
        try:
            rename_noreplace(staging, target)
        except FileExistsError:
            raise OutputError(f"{target} appeared while the bundle was written",
                              hint="another dossier wrote the same release") from None
        fsync_path(out_dir)
    except OSError as exc:
        shutil.rmtree(staging, ignore_errors=True)
        raise output_error(exc, out_dir, f"writing {target.name}",
                           f"write the bundle into {out_dir}") from exc
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    logger.info("wrote %s (%d files)", target, len(manifest.files))
    return WrittenBundle(target, manifest)


class _Build:
    """One staging folder being filled; every file written is listed in the file table."""

    def __init__(self, staging: Path) -> None:
        self.staging = staging
        self.files: list[FileEntry] = []

    def run(self, content: BundleContent) -> Manifest:
        shipped = self._engine(content.shipped)
        baseline = shipped if content.baseline_is_shipped else (
            self._engine(content.baseline) if content.baseline is not None else None)
        identity = content.model if isinstance(content.model, ModelIdentity) \
            else self._model(content.model)
        self._put(Data(MODEL_JSON, json_bytes(identity.model_dump(mode="json"))))
        for item in content.files:
            self._put(item)
        manifest = seal(Manifest(
            format_version=FORMAT_VERSION, dossier_id="0" * 32, release=content.release,
            release_version=content.release_version, description=content.description,
            parent=content.parent, created_at=content.created_at, tool_version=__version__,
            backend=content.backend, tuner_version=content.tuner_version,
            knob_db_digest=content.knob_db_digest, model=identity,
            model_included=not isinstance(content.model, ModelIdentity)
            and content.model.include,
            engines=Engines(shipped=shipped, baseline=baseline), summary=content.summary,
            tuning_host=dict(content.tuning_host), warnings=list(content.warnings),
            files=sorted(self.files, key=lambda f: f.path)))
        write_durable(self.staging / MANIFEST_NAME, manifest_bytes(manifest))
        return manifest

    def _dest(self, rel: str) -> Path:
        dst = self.staging / rel
        dst.parent.mkdir(parents=True, exist_ok=True)
        return dst

    def _add(self, rel: str, digest: str, size: int) -> FileEntry:
        entry = FileEntry(path=rel, size=size, digest=digest)
        self.files.append(entry)
        return entry

    def _put(self, item: Copy | Data | Table) -> FileEntry:
        dst = self._dest(item.rel)
        if isinstance(item, Copy):
            entry = self._add(item.rel, *copy_file_hashed(item.src, dst))
            if item.expect is not None and entry.digest != item.expect:
                raise item.changed or OutputError(f"{item.src} changed while it was bundled")
            return entry
        if isinstance(item, Data):
            write_durable(dst, item.data)
        else:
            tables.write_table(item.table, dst)
        return self._add(item.rel, *digest_file(dst))

    def _engine(self, engine: EngineFile) -> EngineEntry:
        f = self._put(engine.file)
        return EngineEntry(path=f.path, route=engine.route, trial_index=engine.trial_index,
                           size=f.size, digest=f.digest, facts=dict(engine.facts),
                           flags=dict(engine.flags), load=engine.load)

    def _model(self, model: ModelFiles) -> ModelIdentity:
        def identity(src: Path, rel: str, check: bool) -> tuple[str, int]:
            expect = model.expect if check else None
            if model.include:
                f = self._put(Copy(src, rel, expect, model.changed))
                return f.digest, f.size
            digest, size = digest_file(src)
            if expect is not None and digest != expect:
                raise model.changed or ModelError(f"the model {src} changed")
            return digest, size

        digest, size = identity(model.path, f"model/{model.path.name}", True)
        external = []
        for location in model.externals:
            src = model.path.parent / location
            if not src.is_file():
                raise ModelError(f"{model.path}: external data file {location} is missing")
            d, s = identity(src, f"model/{location}", False)
            external.append(ExternalFile(path=location, size=s, digest=d))
        return ModelIdentity(file_name=model.path.name, size=size, digest=digest,
                             external_data=external)


__all__ = ["BundleContent", "Copy", "Data", "EngineFile", "ModelFiles", "Table",
           "WrittenBundle", "build_bundle", "bundle_name", "check_target", "commit_bundle",
           "json_bytes", "trial_counts"]
