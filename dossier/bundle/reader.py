"""Open a bundle (folder or ``.dossier.tar``) and read its parts.

:func:`open_bundle` checks the manifest's format version before anything else. A ``.tar`` is
extracted safely (see :mod:`dossier.bundle.archive`) into a temporary folder that is removed
when the context ends. Opening does not check file digests: :func:`~dossier.bundle.integrity.
check_integrity` does.
"""

from __future__ import annotations

import contextlib
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
from pydantic import BaseModel, ValidationError

from dossier.bundle import tables
from dossier.bundle.manifest import (
    MANIFEST_MAX_BYTES,
    MANIFEST_NAME,
    Manifest,
    ModelIdentity,
    ValidationInfo,
    parse_manifest,
)
from dossier.bundle.writer import CACHE_NAME, FINGERPRINT_NAME, MODEL_JSON, VALIDATION_JSON
from dossier.cache import TuningCache
from dossier.errors import BundleFormatError
from dossier.fingerprint import Fingerprint


class Bundle:
    """An opened bundle: its folder, its manifest and typed access to its files."""

    def __init__(self, path: Path, raw: dict[str, Any], manifest: Manifest, notes: list[str],
                 source: Path | None = None) -> None:
        self.path = Path(path)
        """The bundle folder (for an archive: where it was extracted)."""
        self.raw = raw
        """The manifest JSON as read (the dossier id is computed over this)."""
        self.manifest = manifest
        """The manifest."""
        self.notes = notes
        """Things the reader wants said (e.g. a newer minor format version)."""
        self.source = Path(source) if source is not None else self.path
        """What was opened: the folder or the .dossier.tar."""

    def __repr__(self) -> str:
        return f"Bundle({str(self.source)!r}, id={self.manifest.dossier_id})"

    @property
    def format_warning(self) -> str | None:
        """Set when the bundle's format minor version is newer than this reader's."""
        return self.notes[0] if self.notes else None

    def file(self, rel: str) -> Path:
        """The path of a file of the bundle's file table; BundleFormatError if not listed."""
        if rel not in self.manifest.table():
            raise BundleFormatError(f"{self.source}: {rel} is not in the bundle's file table")
        return self.path / rel

    def _json(self, rel: str, model: type[BaseModel]) -> Any:
        path = self.file(rel)
        try:
            return model.model_validate_json(path.read_bytes())
        except (OSError, ValidationError) as exc:
            raise BundleFormatError(f"{self.source}: {rel} cannot be read ({_first(exc)})",
                                    hint="dossier verify --integrity-only BUNDLE names what is "
                                    "wrong") from exc

    def model_identity(self) -> ModelIdentity:
        """model.json."""
        return self._json(MODEL_JSON, ModelIdentity)  # type: ignore[no-any-return]

    def validation_info(self) -> ValidationInfo:
        """validation.json."""
        return self._json(VALIDATION_JSON, ValidationInfo)  # type: ignore[no-any-return]

    def fingerprint(self) -> Fingerprint:
        """The tuning host (fingerprint.json)."""
        return self._json(FINGERPRINT_NAME, Fingerprint)  # type: ignore[no-any-return]

    def tuning_cache(self) -> TuningCache:
        """The search record, read-only."""
        return TuningCache.open(self.file(CACHE_NAME))

    def table(self, rel: str) -> pa.Table:
        """A Parquet table of the bundle."""
        path = self.file(rel)
        try:
            return tables.read_table(path)
        except (OSError, pa.ArrowException) as exc:
            raise BundleFormatError(f"{self.source}: {rel} is not a readable table ({exc})",
                                    hint="dossier verify --integrity-only BUNDLE names what is "
                                    "wrong") from exc

    def routes(self) -> pa.Table:
        """routes.parquet: one row per trial."""
        return self.table(tables.ROUTES)

    def timings(self) -> pa.Table:
        """timings.parquet: every raw timing sample."""
        return self.table(tables.TIMINGS)

    def shapes(self) -> pa.Table:
        """shapes.parquet: the shape distribution."""
        return self.table(tables.SHAPES)

    def engine_path(self, role: str = "shipped") -> Path:
        """The shipped (or baseline) engine file; BundleFormatError when the bundle has no
        baseline engine (a trtexec import)."""
        entry = self.manifest.engines.shipped if role == "shipped" else self.manifest.engines.baseline
        if entry is None:
            raise BundleFormatError(f"{self.source} has no baseline engine (imported from "
                                    "trtexec, which keeps only the winner's engine)")
        return self.file(entry.path)

    def overview(self) -> dict[str, Any]:
        """What a reviewer wants first, as plain data (``dossier inspect --json``)."""
        m, s = self.manifest, self.manifest.summary
        bt = s.baseline_timing
        return {
            "bundle": str(self.source),
            "release": m.release,
            "version": m.release_version,
            "description": m.description,
            "dossier_id": m.dossier_id,
            "parent": m.parent,
            "created_at": m.created_at,
            "format_version": m.format_version,
            "tool_version": m.tool_version,
            "backend": m.backend,
            "tuner_version": m.tuner_version,
            "model": {"file_name": m.model.file_name, "size": m.model.size,
                      "digest": m.model.digest, "algorithm": m.model.algorithm,
                      "external_data": len(m.model.external_data), "included": m.model_included},
            "strategy": s.strategy,
            "selection": s.selection,
            "metric": s.metric,
            "threshold": s.threshold,
            "atol": s.atol,
            "rtol": s.rtol,
            "validation_pairs": s.validation_pairs,
            "baseline": {"route": s.baseline_route,
                         "median_ms": bt.median_ms if bt else None,
                         "ci_low_ms": bt.ci_low_ms if bt else None,
                         "ci_high_ms": bt.ci_high_ms if bt else None,
                         "n": bt.n if bt else None},
            "winner": {"route": s.shipped_route, "trial_index": s.shipped_index,
                       "engine": m.engines.shipped.path,
                       "is_baseline": m.engines.baseline is not None
                       and m.engines.shipped.trial_index == m.engines.baseline.trial_index},
            "baseline_engine": m.engines.baseline is not None,
            "gain": s.gain,
            "speedup": None if not s.gain or s.speedup is None else {
                "value": s.speedup, "ci_low": s.speedup_ci_low, "ci_high": s.speedup_ci_high,
                "confidence": s.confidence, "p_value": s.p_value},
            "result": s.result,
            "reason": s.reason,
            "decision_rule": s.decision_rule,
            "runner_up": None if s.runner_up_route is None else {
                "route": s.runner_up_route, "speedup": s.runner_up_speedup},
            "aa": None if s.aa is None else s.aa.model_dump(mode="json"),
            "confirm_aa": None if s.confirm_aa is None else s.confirm_aa.model_dump(mode="json"),
            "load": None if m.engines.shipped.load is None
            else m.engines.shipped.load.model_dump(mode="json"),
            "trials": dict(s.trial_counts),
            "confirm_trials": s.confirm_trials,
            "search_wall_s": s.search_wall_s,
            "build_s_total": s.build_s_total,
            "warnings": list(m.warnings),
            "notes": list(self.notes),
            "tuning_host": dict(m.tuning_host),
        }


def read_bundle(folder: Path, *, source: Path | None = None) -> Bundle:
    """Open a bundle folder: read manifest.json (size-capped), check its format version first,
    parse it. BundleFormatError when it is not a bundle of a readable format."""
    folder = Path(folder)
    where = source or folder
    manifest_path = folder / MANIFEST_NAME
    if not folder.is_dir():
        raise BundleFormatError(f"{where} is not a bundle (no such folder or archive)")
    if manifest_path.is_symlink() or not manifest_path.is_file():
        raise BundleFormatError(f"{where} is not a bundle: it has no {MANIFEST_NAME}")
    try:
        with open(manifest_path, "rb") as f:
            data = f.read(MANIFEST_MAX_BYTES + 1)
    except OSError as exc:
        raise BundleFormatError(f"cannot read {where}/{MANIFEST_NAME}: {exc.strerror}") from exc
    raw, manifest, notes = parse_manifest(data, f"{where}/{MANIFEST_NAME}")
    return Bundle(folder, raw, manifest, notes, source=source)


@contextlib.contextmanager
def open_bundle(path: Path, *, workdir: Path | None = None) -> Iterator[Bundle]:
    """Open a bundle folder or ``.dossier.tar`` for the duration of the ``with`` block.

    An archive is extracted safely into a temporary folder (under ``workdir`` if given), which
    is removed afterwards. Raises BundleFormatError when ``path`` is not a readable bundle and
    UnsafeArchiveError for an archive that would write outside its target.
    """
    from dossier.bundle.archive import extract_archive

    path = Path(path)
    if path.is_dir():
        yield read_bundle(path)
        return
    if not path.is_file():
        raise BundleFormatError(f"{path} is not a bundle (no such folder or archive)")
    tmp = Path(tempfile.mkdtemp(prefix="dossier-open-", dir=workdir))
    try:
        folder = extract_archive(path, tmp / "bundle")
        yield read_bundle(folder, source=path)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _first(exc: Exception) -> str:
    if isinstance(exc, ValidationError):
        err = exc.errors()[0]
        return f"{'.'.join(str(p) for p in err['loc']) or 'top level'}: {err['msg']}"
    return str(getattr(exc, "strerror", None) or exc)
