"""Open a bundle (folder or ``.dossier.tar``) and read its parts.

:func:`open_bundle` checks the manifest's format version before anything else. A ``.tar`` has
every member header checked against its manifest first (see :mod:`dossier.bundle.archive`),
then is extracted into a temporary folder, each file verified against its xxh3-128 as it
streams: all of it, or with ``lazy=True`` only the files the command reads, when it reads them
(``inspect`` extracts nothing; ``verify --integrity-only`` hashes the members in place), up to
a per-command size cap. The temporary folder ``dossier-open-PID-*`` is removed when the context
ends, and on SIGTERM (the CLI unwinds); one left by a killed process is removed by the next
open once its process is gone and it is older than :data:`STALE_OPEN_S`. Opening a folder does
not check file digests: :func:`~dossier.bundle.integrity.check_integrity` does.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import secrets
import shutil
import stat
import tempfile
from collections.abc import Callable, Collection, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ValidationError

from dossier.bundle import archive as _archive
from dossier.bundle.archive import ArchiveIndex, extract_index, index_archive
from dossier.bundle.manifest import (
    MANIFEST_MAX_BYTES,
    MANIFEST_NAME,
    MODEL_JSON,
    VALIDATION_JSON,
    Manifest,
    ModelIdentity,
    ValidationInfo,
    parse_manifest,
)
from dossier.diskfull import check_room, host_io, is_disk_full
from dossier.errors import BundleError, BundleFormatError
from dossier.files import (
    PRIVATE_FILE,
    PRIVATE_FOLDER,
    NotAFileError,
    copy_digests,
    read_small,
    remove_stale,
)
from dossier.hashing import ALGORITHM, feed, new_hasher
from dossier.run_folder import CACHE_NAME, FINGERPRINT_NAME

if TYPE_CHECKING:  # loaded when first read: verify --integrity-only needs neither
    import pyarrow as pa

    from dossier.cache import TuningCache
    from dossier.fingerprint import Fingerprint


class Bundle:
    """An opened bundle: its folder, its manifest and typed access to its files."""

    def __init__(self, path: Path, raw: dict[str, Any], manifest: Manifest, notes: list[str],
                 source: Path | None = None, archive: ArchiveIndex | None = None,
                 max_extract: int | None = None) -> None:
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
        self.archive = archive
        """For a .tar opened lazily: its checked index; files are extracted when first read."""
        self.max_extract = max_extract
        """At most this many bytes are extracted from the archive (None: no cap)."""
        self.extracted = 0
        """Bytes extracted so far."""
        self.written: dict[str, tuple[int, dict[str, str]]] | None = None
        """For an archive extracted whole, or a folder copied (``private``): manifest.json's
        and every file's size and digests, of the bytes written, computed as they were written
        (see :func:`open_bundle`)."""
        self.odd: list[str] = []
        """For a folder copied: its entries that are not regular files (not copied)."""
        self.unreadable: dict[str, str] = {}
        """For a folder copied: its regular files that could not be read, with why."""
        self.absent: frozenset[str] = frozenset()
        """For a folder copied: files hashed in place but not copied (this command does not
        read them after the checks); :meth:`file` refuses them."""
        self.pinned: dict[str, bytes] = {}
        """Files whose checked bytes are kept in memory (a folder checked in place): read from
        here, never again from the folder (see :meth:`pin`)."""

    def __repr__(self) -> str:
        return f"Bundle({str(self.source)!r}, id={self.manifest.dossier_id})"

    @property
    def format_warning(self) -> str | None:
        """Set when the bundle's format minor version is newer than this reader's."""
        return self.notes[0] if self.notes else None

    def file(self, rel: str) -> Path:
        """The path of a file of the bundle's file table (extracted now when the bundle is an
        archive opened lazily); BundleFormatError if not listed."""
        if rel not in self.manifest.table():
            raise BundleFormatError(f"{self.source}: {rel} is not in the bundle's file table")
        if rel in self.absent:
            raise BundleError(f"{self.source}: {rel} was checked in place but not copied for "
                              "this command, which reads only what it copied")
        path = self.path / rel
        if self.archive is not None and not path.is_file():
            self._extract([rel])
        return path

    def folder(self, rel: str) -> Path:
        """The bundle folder ``rel`` (e.g. ``validation``), every file under it extracted when
        the bundle is an archive opened lazily."""
        if self.archive is not None:
            prefix = rel.rstrip("/") + "/"
            self._extract([r for r in self.archive.members if r.startswith(prefix)
                           and not (self.path / r).is_file()])
        return self.path / rel

    def _extract(self, files: list[str]) -> None:
        assert self.archive is not None
        size = self.archive.size(files)
        if self.max_extract is not None and self.extracted + size > self.max_extract:
            raise BundleError(f"{self.source}: reading {files[0]} would extract "
                              f"{self.extracted + size} bytes, more than the {self.max_extract} "
                              "this command allows", hint="the manifest lists files far larger "
                              "than this command reads; check the archive with dossier verify")
        with host_io(self.path.parent, f"opening {self.source}"):
            if not self.path.parent.is_dir():
                _private_folder(self.path.parent)
            self.path.mkdir(mode=PRIVATE_FOLDER, exist_ok=True)
        check_room(self.path, size, f"extracting {self.source.name}")
        for rel in files:
            dest = self.path.joinpath(*rel.split("/"))
            with host_io(self.path, f"opening {self.source}"):
                dest.parent.mkdir(mode=PRIVATE_FOLDER, parents=True, exist_ok=True)
            _archive.extract_member(self.archive, rel, dest,  # by module: tests count calls
                                    mode=PRIVATE_FILE)
            self.extracted += self.archive.members[rel][1]

    def pin(self, files: dict[str, bytes]) -> None:
        """Keep these bytes, read (and hashed) by the integrity check, as the content of their
        files: a later step that reads one of them (the environment step: fingerprint.json)
        reads what was checked, not what the folder holds by then."""
        self.pinned.update(files)

    def _json(self, rel: str, model: type[BaseModel]) -> Any:
        try:
            data = self.pinned.get(rel)
            if data is None:
                data = read_small(self.file(rel), JSON_MAX_BYTES, follow=False)
            return model.model_validate_json(data)
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
        from dossier.fingerprint import Fingerprint

        return self._json(FINGERPRINT_NAME, Fingerprint)  # type: ignore[no-any-return]

    def tuning_cache(self) -> TuningCache:
        """The search record, read-only: streamed within the cache's limits, nothing after
        its last record (:meth:`~dossier.cache.TuningCache.open` with ``whole``)."""
        from dossier.cache import TuningCache

        return TuningCache.open(self.file(CACHE_NAME), whole=True)

    def table(self, rel: str) -> pa.Table:
        """A Parquet table of the bundle."""
        import pyarrow as pa

        from dossier.bundle import tables

        path = self.file(rel)
        try:
            return tables.read_table(path)
        except (OSError, pa.ArrowException) as exc:
            raise BundleFormatError(f"{self.source}: {rel} is not a readable table ({exc})",
                                    hint="dossier verify --integrity-only BUNDLE names what is "
                                    "wrong") from exc

    def routes(self) -> pa.Table:
        """routes.parquet: one row per trial."""
        from dossier.bundle.tables import ROUTES

        return self.table(ROUTES)

    def timings(self) -> pa.Table:
        """timings.parquet: every raw timing sample."""
        from dossier.bundle.tables import TIMINGS

        return self.table(TIMINGS)

    def shapes(self) -> pa.Table:
        """shapes.parquet: the shape distribution."""
        from dossier.bundle.tables import SHAPES

        return self.table(SHAPES)

    def engine_path(self, role: str = "shipped") -> Path:
        """The shipped (or baseline) engine file; BundleFormatError when the bundle has no
        baseline engine (a trtexec import)."""
        entry = self.manifest.engines.shipped if role == "shipped" else self.manifest.engines.baseline
        if entry is None:
            raise BundleFormatError(f"{self.source} has no baseline engine (imported from "
                                    "trtexec, which keeps only the winner's engine)")
        return self.file(entry.path)

    def load_hints(self) -> list[str]:
        """How to load the shipped engine in one's own process, when it needs more than the
        backend's loader (an AOTInductor package that carries its own libstdc++)."""
        from dossier.errors import DossierError

        index = self.manifest.engines.shipped.trial_index
        try:
            trials = self.tuning_cache().trials
        except DossierError:  # an archive whose records cannot be read here (TMPDIR full)
            return []
        trial = next((t for t in trials if t.index == index and t.role != "confirm"), None)
        hint = trial.extra.get("load_hint") if trial is not None else None
        return [hint] if hint else []


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
        data = read_small(manifest_path, MANIFEST_MAX_BYTES, follow=False)
    except NotAFileError as exc:
        raise BundleFormatError(f"{where}/{MANIFEST_NAME}: {exc.strerror}") from exc
    except OSError as exc:
        raise BundleFormatError(f"cannot read {where}/{MANIFEST_NAME}: {exc.strerror}") from exc
    raw, manifest, notes = parse_manifest(data, f"{where}/{MANIFEST_NAME}")
    return Bundle(folder, raw, manifest, notes, source=source)


@contextlib.contextmanager
def open_bundle(path: Path, *, workdir: Path | None = None, lazy: bool = False,
                max_extract: int | None = None, digests: Sequence[str] = (),
                private: bool = False,
                unused: Callable[[Manifest], Collection[str]] | None = None
                ) -> Iterator[Bundle]:
    """Open a bundle folder or ``.dossier.tar`` for the duration of the ``with`` block.

    An archive has its member headers checked against its manifest, then is extracted (every
    file verified against its digest as it streams) into a temporary folder under ``workdir``
    (default: the system's), which is removed afterwards; xxh3-128 and each of ``digests``
    (e.g. BLAKE3 for a signature) of every file are computed as it is written and kept in
    :attr:`Bundle.written`, so that :func:`~dossier.bundle.integrity.scan_bundle` reads nothing
    again. With ``lazy`` nothing is extracted up front: :meth:`Bundle.file` and
    :meth:`Bundle.folder` extract what is read, at most ``max_extract`` bytes. Raises BundleFormatError when ``path`` is not a readable bundle,
    UnsafeArchiveError for an archive whose members disagree with its manifest or would write
    outside its target, IntegrityError for a member that does not match its digest, and
    DiskFullError when the temporary folder's file system has no room.

    A folder is read in place, unless ``private``: then it is copied into that temporary
    folder (each file opened without following a link or blocking, hashed as it is copied,
    like an archive's members), so that what a loader reads after the checks is what they
    checked, whatever another process does to the folder meanwhile. The temporary folder and
    every file in it are created owner-only whatever the umask. ``unused(manifest)``: bundle
    paths the command will not read after the checks; they are hashed in place, not copied
    (:attr:`Bundle.absent`).
    """
    path = Path(path)
    if path.is_dir() and not private:
        yield read_bundle(path)
        return
    if not path.is_dir() and not path.is_file():
        raise BundleFormatError(f"{path} is not a bundle (no such folder or archive)")
    index = None if path.is_dir() else index_archive(path)  # every header; nothing written
    skip: Collection[str] = ()
    if index is None:  # a bundle of a readable format: its manifest checked before a copy
        first = read_bundle(path)
        skip = unused(first.manifest) if unused is not None else ()
    base = Path(workdir) if workdir is not None else Path(tempfile.gettempdir())
    remove_stale_opens(base)
    tmp = base / f"{OPEN_PREFIX}{os.getpid()}-{secrets.token_hex(6)}"
    try:
        if index is None:
            with host_io(base, f"opening {path}"):
                _private_folder(tmp)
            copied = copy_folder(path, tmp / "bundle", digests, skip)
            bundle = read_bundle(tmp / "bundle", source=path)
            bundle.written, bundle.odd, bundle.unreadable = copied
            bundle.absent = frozenset(r for r in skip if r in copied[0])
            yield bundle
        elif lazy:
            raw, manifest, notes = parse_manifest(index.manifest, f"{path}:{MANIFEST_NAME}")
            yield Bundle(tmp / "bundle", raw, manifest, notes, source=path, archive=index,
                         max_extract=max_extract)
        else:
            with host_io(base, f"opening {path}"):
                _private_folder(tmp)
            written = extract_index(index, tmp / "bundle", algorithms=digests,
                                    mode=PRIVATE_FILE)
            bundle = read_bundle(tmp / "bundle", source=path)
            bundle.written = written
            yield bundle
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _private_folder(path: Path) -> None:
    """Create the folder ``path``, owner-only whatever the umask."""
    path.mkdir(mode=PRIVATE_FOLDER)
    os.chmod(path, PRIVATE_FOLDER)  # explicit: mkdir's mode is less the umask


Copied = tuple[dict[str, tuple[int, dict[str, str]]], list[str], dict[str, str]]


def copy_folder(src: Path, target: Path, algorithms: Sequence[str] = (),
                skip: Collection[str] = ()) -> Copied:
    """Copy the bundle folder ``src`` into the new folder ``target`` (owner-only, whatever
    the umask), hashing each file as it is copied: returns the size and digests (xxh3-128 and
    each of ``algorithms``) of every file written, by bundle path; the entries that are not
    regular files (links, FIFOs, devices: never followed, never opened in a way that blocks,
    not copied); and the regular files that could not be read, with why. What the copy holds
    is exactly what was hashed: another process that swaps, relinks or rewrites a file of
    ``src`` afterwards changes nothing of it. The files of ``skip`` are hashed in place and
    not written (nothing reads them afterwards)."""
    names = list(dict.fromkeys([ALGORITHM, *algorithms]))
    written: dict[str, tuple[int, dict[str, str]]] = {}
    odd: list[str] = []
    unreadable: dict[str, str] = {}
    flags = os.O_RDONLY | os.O_CLOEXEC | getattr(os, "O_NOFOLLOW", 0) | getattr(
        os, "O_NONBLOCK", 0)
    with host_io(target.parent, f"copying {src}"):
        target.mkdir(mode=PRIVATE_FOLDER)
        for folder, dirs, files in os.walk(src, followlinks=False):
            base = Path(folder).relative_to(src)
            for name in sorted(dirs):
                rel = (base / name).as_posix()
                if os.path.islink(os.path.join(folder, name)):
                    odd.append(rel)
            for name in sorted(files):
                rel = (base / name).as_posix()
                try:
                    fd = os.open(os.path.join(folder, name), flags)
                except OSError as exc:
                    if exc.errno == errno.ELOOP:
                        odd.append(rel)
                    else:
                        unreadable[rel] = str(exc.strerror or exc)
                    continue
                with open(fd, "rb", buffering=0) as f:
                    if not stat.S_ISREG(os.fstat(fd).st_mode):
                        odd.append(rel)
                        continue
                    try:
                        if rel in skip:
                            hashers = [new_hasher(a) for a in names]
                            size = feed(f, hashers)
                            digests = {a: h.hexdigest() for a, h in zip(names, hashers,
                                                                        strict=True)}
                        else:
                            dest = target.joinpath(*rel.split("/"))
                            for up in reversed(dest.relative_to(target).parents[:-1]):
                                with contextlib.suppress(FileExistsError):  # as files need it
                                    (target / up).mkdir(mode=PRIVATE_FOLDER)
                            digests, size = copy_digests(f, dest, names, mode=PRIVATE_FILE,
                                                         sync=False)
                    except OSError as exc:
                        if is_disk_full(exc):
                            raise
                        unreadable[rel] = str(exc.strerror or exc)
                        continue
                written[rel] = (size, digests)
    return dict(sorted(written.items())), sorted(odd), unreadable


JSON_MAX_BYTES = 64 << 20
"""Largest JSON record of a bundle read whole (fingerprint.json, model.json, ...)."""
RECORDS_MAX_EXTRACT = 1 << 30
"""Cap on what ``explain`` and ``diff`` extract from an archive: they read the records
(tables, tuning cache, fingerprint, knobs), never an engine or the model."""
OPEN_PREFIX = "dossier-open-"
"""Temporary folders of opened archives: ``dossier-open-PID-RANDOM``."""
STALE_OPEN_S = 600
"""A temporary folder whose process is gone is removed once it is older than this (seconds)."""
_OPEN = re.compile(rf"^{re.escape(OPEN_PREFIX)}(?P<pid>\d+)-[0-9a-f]+$")


def remove_stale_opens(folder: Path, *, older_than_s: float = STALE_OPEN_S) -> list[Path]:
    """Remove ``dossier-open-PID-*`` folders in ``folder`` left by killed processes: the PID is
    not running and the folder was not touched for ``older_than_s``. Returns them."""
    return remove_stale(Path(folder), _OPEN, older_than_s=older_than_s, dirs_only=True)


def _first(exc: Exception) -> str:
    if isinstance(exc, ValidationError):
        err = exc.errors()[0]
        return f"{'.'.join(str(p) for p in err['loc']) or 'top level'}: {err['msg']}"
    return str(getattr(exc, "strerror", None) or exc)
