"""Reading the single-file form of a bundle, ``NAME-VERSION.dossier.tar`` (packing it:
:mod:`dossier.bundle.pack`). This module knows archives and manifests only, not opened bundles,
so the reader builds on it.

Nothing is written until every member header has been checked: the manifest member is read
first (size-capped, format version checked), then absolute paths, ``..``, symbolic and hard
links, devices, fifos, duplicate members, members not in the manifest's file table, members of
another size than the table says and files the table lists but the archive lacks are refused
with :class:`~dossier.errors.UnsafeArchiveError`. Members are then read in place (their data is
contiguous in an uncompressed tar) in fixed-size chunks, each verified against the manifest's
xxh3-128 as it streams: :func:`scan_archive` hashes without writing (``verify
--integrity-only``, signatures), :func:`extract_member` writes one file (what a command needs),
:func:`extract_archive` all of them, after checking the file system has room
(:func:`extract_index` also returns the digests of what it wrote, so that nothing extracted
is read again to be checked). ``tarfile``'s own
extraction is never used.
"""

from __future__ import annotations

import contextlib
import io
import os
import shutil
import tarfile
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO, TypeVar

from dossier.bundle.manifest import MANIFEST_MAX_BYTES, MANIFEST_NAME, FileEntry, parse_manifest
from dossier.diskfull import check_room, host_io
from dossier.errors import BundleFormatError, IntegrityError, OutputError, UnsafeArchiveError
from dossier.files import copy_digests, write_durable
from dossier.hashing import ALGORITHM, new_hasher

_T = TypeVar("_T")

MAX_MEMBERS = 100_000
"""An archive with more members than this is refused while its headers are read."""


@dataclass(frozen=True)
class ArchiveIndex:
    """A ``.dossier.tar`` whose every member header was checked against its manifest: what
    :func:`index_archive` returns, and what members are read through. Nothing was written."""

    archive: Path
    """The archive file."""
    root: str
    """The bundle folder's name inside it (``NAME-VERSION.dossier``)."""
    manifest: bytes
    """manifest.json as stored (at most MANIFEST_MAX_BYTES)."""
    table: dict[str, FileEntry]
    """The manifest's file table: every file member, by bundle path."""
    members: dict[str, tuple[int, int]]
    """Bundle path -> (offset of its data in the archive, size)."""
    folders: list[str]
    """Folder members, by bundle path, in archive order."""

    def size(self, files: Iterable[str] | None = None) -> int:
        """Bytes of ``files`` (default: every file)."""
        return sum(self.members[r][1] for r in (self.members if files is None else files))


def _open(archive: Path) -> tarfile.TarFile:
    """``archive`` opened for reading its member headers (uncompressed tar only)."""
    try:
        return tarfile.open(archive, mode="r:", encoding="utf-8")
    except (tarfile.TarError, OSError) as exc:
        raise BundleFormatError(f"{archive} is neither a bundle folder nor a bundle archive "
                                f"({exc})") from exc


def index_archive(archive: Path) -> ArchiveIndex:
    """Read every member header of ``archive`` and check it against the manifest (read first,
    size-capped), writing nothing: UnsafeArchiveError names the first member that is unsafe,
    not in the file table, of another size than the table says, or missing (the member count
    must be the table's); BundleFormatError for an archive that is not a readable bundle."""
    archive = Path(archive)
    with _open(archive) as tar:
        members = _headers(tar, archive)
        root, data, table = _read_manifest(tar, members, archive)
        plan = _check_members(members, root, table, archive)
    files = {rel: (m.offset_data, m.size) for m, rel in plan if m.isreg() and rel != MANIFEST_NAME}
    return ArchiveIndex(archive, root, data, table, files,
                        [rel for m, rel in plan if m.isdir()])


def open_member(index: ArchiveIndex, rel: str) -> BinaryIO:
    """A reader of the member ``rel`` (a bundle path of the file table), exactly its size."""
    offset, size = index.members[rel]
    f = open(index.archive, "rb", buffering=0)  # noqa: SIM115 - returned to the caller
    f.seek(offset)
    return _Slice(f, size)  # type: ignore[return-value]


class _Slice(io.RawIOBase):
    """At most ``size`` bytes of an open file, from where it stands; closes it when closed."""

    def __init__(self, f: BinaryIO, size: int) -> None:
        self.f, self.left = f, size

    def readable(self) -> bool:
        return True

    def readinto(self, buf: Any) -> int:
        view = memoryview(buf)[: self.left]
        n = self.f.readinto(view) if view.nbytes else 0  # type: ignore[attr-defined]
        self.left -= n or 0
        return n or 0

    def close(self) -> None:
        self.f.close()
        super().close()


def extract_member(index: ArchiveIndex, rel: str, dest: Path,
                   algorithms: Sequence[str] = (), *, mode: int = 0o666) -> dict[str, str]:
    """Copy the member ``rel`` into the new file ``dest``, verifying it against the manifest's
    size and xxh3-128 as it streams; on a mismatch ``dest`` is removed and IntegrityError names
    the member. A full disk is DiskFullError, with ``dest`` removed. Returns the digests of what
    was written: xxh3-128 and each of ``algorithms``, from the same read. ``mode``: the new
    file's permissions (less the umask)."""
    entry = index.table[rel]
    try:
        with open_member(index, rel) as src, host_io(dest.parent, f"extracting {rel} from "
                                                     f"{index.archive}"):
            digests, size = copy_digests(src, dest, _with_xxh3(algorithms), limit=entry.size,
                                         mode=mode)
    except BaseException:
        dest.unlink(missing_ok=True)
        raise
    if size != entry.size or digests[ALGORITHM] != entry.digest:
        dest.unlink(missing_ok=True)
        raise IntegrityError(f"{index.archive}: member {rel} is altered "
                             + (f"({size} bytes, the manifest says {entry.size})"
                                if size != entry.size else
                                f"(xxh3-128 {digests[ALGORITHM]}, the manifest says "
                                f"{entry.digest})"))
    return digests


def extract_archive(archive: Path, target: Path, files: Iterable[str] | None = None) -> Path:
    """Extract a ``.dossier.tar`` into the new folder ``target`` (its parent must exist) and
    return ``target``, which then holds manifest.json and the bundle's files (``files``: only
    those bundle paths).

    Every member header is checked before any byte is written (see the module docstring and
    :func:`index_archive`), the file system must have room for what is extracted, and each
    member is verified against its xxh3-128 as it streams (IntegrityError naming it);
    UnsafeArchiveError names the first offending member, BundleFormatError an archive that is
    not a bundle of a readable format, DiskFullError a full disk. On any failure ``target`` is
    removed.
    """
    extract_index(index_archive(Path(archive)), Path(target), files)
    return Path(target)


def extract_index(index: ArchiveIndex, target: Path, files: Iterable[str] | None = None,
                  algorithms: Sequence[str] = (), *, mode: int = 0o666
                  ) -> dict[str, tuple[int, dict[str, str]]]:
    """:func:`extract_archive` of an archive already indexed (its headers checked): returns,
    for manifest.json and every file extracted, its size and digests (xxh3-128 and each of
    ``algorithms``) of the bytes written, computed as they were written: what a check of the
    extracted folder would read again."""
    target = Path(target)
    if os.path.lexists(target):
        raise OutputError(f"extraction target {target} exists already")
    wanted = list(index.members) if files is None else [r for r in index.members if r in set(files)]
    check_room(target.parent, index.size(wanted) + len(index.manifest),
               f"extracting {index.archive.name}")
    with host_io(target.parent, f"extracting {index.archive}"):
        target.mkdir(mode=_folder_mode(mode))
    written = {MANIFEST_NAME: (len(index.manifest), _digests(index.manifest, algorithms))}
    try:
        with host_io(target, f"extracting {index.archive}"):
            write_durable(target / MANIFEST_NAME, index.manifest, mode=mode)
            for rel in index.folders if files is None else []:
                _folders(target, rel, _folder_mode(mode))
        for rel in wanted:
            dest = target.joinpath(*rel.split("/"))
            _folders(target, str(Path(rel).parent), _folder_mode(mode))
            written[rel] = (index.members[rel][1], extract_member(index, rel, dest, algorithms,
                                                                  mode=mode))
    except BaseException:
        shutil.rmtree(target, ignore_errors=True)
        raise
    return dict(sorted(written.items()))


def _folder_mode(file_mode: int) -> int:
    """A folder's permissions for files of ``file_mode``: each read bit with its search bit."""
    return file_mode | ((file_mode & 0o444) >> 2)


def _folders(target: Path, rel: str, mode: int = 0o777) -> None:
    """The folder ``rel`` under ``target`` and those on its way, each made with ``mode``."""
    path = target
    for part in Path(rel).parts:
        path = path / part
        with contextlib.suppress(FileExistsError):
            path.mkdir(mode=mode)


def _with_xxh3(algorithms: Sequence[str]) -> list[str]:
    return list(dict.fromkeys([ALGORITHM, *algorithms]))


def _digests(data: bytes, algorithms: Sequence[str]) -> dict[str, str]:
    hashers = {a: new_hasher(a) for a in _with_xxh3(algorithms)}
    for h in hashers.values():
        h.update(memoryview(data))
    return {a: h.hexdigest() for a, h in hashers.items()}


def scan_archive(index: ArchiveIndex, hasher: Callable[[BinaryIO], _T]) -> dict[str, _T]:
    """``hasher`` over manifest.json and every file member, streamed; nothing is written."""
    out = {MANIFEST_NAME: hasher(io.BytesIO(index.manifest))}
    for rel in index.members:
        with open_member(index, rel) as src:
            out[rel] = hasher(src)
    return dict(sorted(out.items()))


def scan_members(archive: Path, hasher: Callable[[BinaryIO], _T]) -> dict[str, _T]:
    """``hasher`` over every file member of ``archive`` (manifest.json included, when there),
    by bundle path, streamed in place; nothing is written. For an archive whose manifest
    cannot be read (the signature check of a bundle whose manifest.json no longer parses): the
    member headers are checked by the same rules as :func:`index_archive`'s (absolute paths,
    ``..``, links, devices, duplicates, members outside the bundle folder: UnsafeArchiveError;
    more than MAX_MEMBERS, a truncated archive: BundleFormatError), against a file table made
    of the members themselves instead of the manifest's."""
    archive = Path(archive)
    with _open(archive) as tar:
        members = _headers(tar, archive)
    manifests = [m.name for m in members
                 if m.name.count("/") == 1 and m.name.split("/")[1] == MANIFEST_NAME]
    root = (manifests[0] if manifests else members[0].name).split("/")[0]
    table: dict[str, FileEntry] = {}
    for m in members:
        rel = m.name[len(root) + 1:]
        if m.isreg() and m.name.startswith(root + "/") and rel != MANIFEST_NAME:
            with contextlib.suppress(ValueError):  # a path the member checks refuse below
                table.setdefault(rel, FileEntry(path=rel, size=m.size, digest="0" * 32))
    out: dict[str, _T] = {}
    for m, rel in _check_members(members, root, table, archive):
        if m.isreg():
            with open(archive, "rb", buffering=0) as f:
                f.seek(m.offset_data)
                out[rel] = hasher(_Slice(f, m.size))  # type: ignore[arg-type]
    return dict(sorted(out.items()))


def _headers(tar: tarfile.TarFile, archive: Path) -> list[tarfile.TarInfo]:
    members = []
    try:
        for member in tar:
            members.append(member)
            if len(members) > MAX_MEMBERS:
                raise UnsafeArchiveError(f"{archive} has more than {MAX_MEMBERS} members")
    except tarfile.TarError as exc:
        raise BundleFormatError(f"{archive} is a truncated or corrupt archive ({exc})") from exc
    if not members:
        raise BundleFormatError(f"{archive} is an empty archive, not a bundle")
    return members


def _read_manifest(tar: tarfile.TarFile, members: list[tarfile.TarInfo],
                   archive: Path) -> tuple[str, bytes, dict[str, FileEntry]]:
    found = [m for m in members
             if m.name.count("/") == 1 and m.name.split("/")[1] == MANIFEST_NAME]
    if not found:
        raise BundleFormatError(f"{archive} is not a bundle archive: it has no "
                                f"FOLDER/{MANIFEST_NAME} member")
    if len(found) > 1:
        raise UnsafeArchiveError(f"{archive}: member {found[1].name!r} appears twice")
    member = found[0]
    if not member.isreg() or member.issparse():
        raise UnsafeArchiveError(f"{archive}: member {member.name!r} is not a regular file")
    if member.size > MANIFEST_MAX_BYTES:
        raise BundleFormatError(f"{archive}: {member.name} is larger than "
                                f"{MANIFEST_MAX_BYTES >> 20} MiB; not a dossier manifest")
    src = tar.extractfile(member)
    assert src is not None  # a regular file
    with src:
        data = src.read(MANIFEST_MAX_BYTES + 1)
    _, manifest, _ = parse_manifest(data, f"{archive}:{member.name}")
    root = member.name.split("/")[0]
    return root, data, {f.path: f for f in manifest.files}


def _check_members(members: list[tarfile.TarInfo], root: str, table: dict[str, FileEntry],
                   archive: Path) -> list[tuple[tarfile.TarInfo, str]]:
    """Refuse anything unsafe; return (member, path relative to the bundle folder)."""
    folders = {""} | {"/".join(p.split("/")[:i]) for p in table for i in range(1, p.count("/") + 1)}
    seen: set[str] = set()
    plan = []
    for m in members:
        name = m.name

        def refuse(why: str, name: str = name) -> UnsafeArchiveError:
            return UnsafeArchiveError(f"{archive}: member {name!r} {why}; nothing was extracted")

        parts = name.split("/")
        if name.startswith("/") or (len(name) > 1 and name[1] == ":"):
            raise refuse("has an absolute path")
        if ".." in parts:
            raise refuse("leads out of the extraction folder ('..')")
        if "\\" in name or "\x00" in name or any(p in ("", ".") for p in parts):
            raise refuse("has a malformed path")
        if m.issym() or m.islnk():
            raise refuse(f"is a {'symbolic' if m.issym() else 'hard'} link (to {m.linkname!r})")
        if m.ischr() or m.isblk() or m.isfifo():
            raise refuse("is a device or fifo")
        if not (m.isreg() or m.isdir()) or m.issparse():
            raise refuse("is not a regular file or folder")
        if name in seen:
            raise refuse("appears twice")
        seen.add(name)
        if parts[0] != root:
            raise refuse(f"lies outside the bundle folder {root!r}")
        rel = "/".join(parts[1:])
        if m.isdir():
            if rel not in folders:
                raise refuse("is a folder the manifest's file table does not have")
        elif rel != MANIFEST_NAME:
            if rel not in table:
                raise refuse("is not in the manifest's file table")
            if m.size != table[rel].size:
                more = "larger" if m.size > table[rel].size else "smaller"
                raise refuse(f"is {m.size} bytes, {more} than the {table[rel].size} the "
                             "manifest says")
        plan.append((m, rel))
    missing = sorted(set(table) - {rel for _, rel in plan})
    if missing:
        raise UnsafeArchiveError(f"{archive}: the manifest lists {len(table)} files, the archive "
                                 f"holds {len(table) - len(missing)} (no {missing[0]!r}); "
                                 "nothing was extracted")
    return plan

