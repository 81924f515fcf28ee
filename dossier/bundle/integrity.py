"""Integrity: every file of a bundle against the manifest's file table, and the manifest
against its dossier id.

Every file is read once: :func:`scan_bundle` streams each file actually in the bundle (or each
member of an archive opened lazily) once and feeds every hasher a command needs (xxh3-128
always; BLAKE3 for a signature, SHA-256 for a registry push); :func:`check_integrity`, the
signature check and a push take their digests from that one scan.

xxh3-128 detects corruption (a flipped bit, a truncated copy, a file edited by mistake); it is
not a cryptographic digest and does not stop someone who wants to forge a bundle. That needs a
signature over the manifest with cryptographic digests of every file.
"""

from __future__ import annotations

import enum
import errno
import os
import stat
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

from dossier.bundle.archive import scan_archive
from dossier.bundle.manifest import MANIFEST_NAME, body_digest
from dossier.bundle.reader import JSON_MAX_BYTES, Bundle
from dossier.errors import IntegrityError
from dossier.hashing import ALGORITHM, feed, new_hasher


class ProblemKind(str, enum.Enum):
    """What is wrong with one file."""

    MISSING = "missing"
    """Listed in the file table, absent from the bundle."""
    EXTRA = "extra"
    """Present in the bundle, not listed in the file table."""
    ALTERED = "altered"
    """Present, but its size, digest or type differs from the table (or, for manifest.json,
    its content no longer matches its dossier id)."""


@dataclass(frozen=True)
class Problem:
    """One file that fails the check."""

    path: str
    """Bundle-relative path."""
    kind: ProblemKind
    """Missing, extra or altered."""
    detail: str = ""
    """What differs."""

    def __str__(self) -> str:
        return f"{self.path}: {self.kind.value}" + (f" ({self.detail})" if self.detail else "")


@dataclass(frozen=True)
class IntegrityReport:
    """The result of :func:`check_integrity`; true when every file is intact."""

    dossier_id: str
    """The id the manifest claims."""
    checked: int
    """Files in the file table."""
    problems: list[Problem] = field(default_factory=list)
    """Every missing, extra or altered file, sorted by path."""

    def __bool__(self) -> bool:
        return self.checked > 0 and not self.problems

    @property
    def ok(self) -> bool:
        """Every listed file present and unchanged, nothing extra, the manifest unaltered."""
        return bool(self)

    def __str__(self) -> str:
        if self:
            return f"{self.checked} files intact, id {self.dossier_id}"
        if not self.problems:
            return "the file table is empty: nothing to check"
        return "; ".join(str(p) for p in self.problems)


@dataclass(frozen=True)
class Scanned:
    """One regular file of a bundle, read once."""

    size: int
    """Bytes read."""
    digests: dict[str, str]
    """Hex digest by algorithm (``xxh3-128`` always)."""
    data: bytes | None = None
    """The bytes read, for a file kept (see :func:`scan_folder`'s ``keep``)."""


@dataclass(frozen=True)
class BundleScan:
    """Every entry actually in a bundle (not what its manifest says), each regular file read
    once by :func:`scan_bundle` with every hasher asked for."""

    algorithms: tuple[str, ...]
    """The algorithms every file was hashed with (``xxh3-128`` first)."""
    files: dict[str, Scanned]
    """Regular files by bundle path, manifest.json included."""
    odd: list[str]
    """Entries that are not regular files (links, devices, fifos; never followed), sorted."""
    unreadable: dict[str, str] = field(default_factory=dict)
    """Regular files that could not be read, with why."""

    def digests(self, algorithm: str) -> dict[str, str]:
        """``algorithm``'s digest of every regular file, by bundle path, sorted."""
        return {rel: f.digests[algorithm] for rel, f in sorted(self.files.items())}

    def has(self, algorithm: str) -> bool:
        """True when every file was hashed with ``algorithm``."""
        return algorithm in self.algorithms


def scan_bundle(bundle: Bundle, algorithms: Sequence[str] = (),
                keep: Sequence[str] = ()) -> BundleScan:
    """Read every regular file actually in ``bundle`` once, feeding xxh3-128 and each of
    ``algorithms`` (see :func:`dossier.hashing.new_hasher`) from the same chunks. Links are
    never followed (they are listed as odd). An archive opened lazily is read member by member
    in place, manifest.json included, writing nothing; an archive extracted whole with these
    digests is not read again: its files' digests were computed as they were written (what
    was written is what the extracted folder holds, in a temporary folder of this process;
    a folder copied likewise). ``keep``: bundle paths whose bytes are kept in the scan, for a
    folder read in place (see :meth:`Bundle.pin`)."""
    names = _names(algorithms)
    if bundle.written is not None and all(set(names) <= set(d) for _, d in
                                          bundle.written.values()):
        return BundleScan(names, {rel: Scanned(size, {a: d[a] for a in names})
                                  for rel, (size, d) in bundle.written.items()},
                          list(bundle.odd), dict(bundle.unreadable))
    if bundle.archive is not None:
        return BundleScan(names, scan_archive(bundle.archive, lambda f: _read(f, names)), [])
    return scan_folder(bundle.path, algorithms, keep)


def scan_folder(root: Path, algorithms: Sequence[str] = (), keep: Sequence[str] = ()
                ) -> BundleScan:
    """:func:`scan_bundle` of the folder ``root``, whether or not it holds a readable
    manifest. Files are opened without following a link or blocking (an entry swapped for a
    FIFO after the listing is odd, not a hang). The bytes of the files of ``keep`` are kept
    (:attr:`Scanned.data`): hashed as read, what a later step uses in place of the file."""
    names = _names(algorithms)
    kept = set(keep)
    files: dict[str, Scanned] = {}
    odd: list[str] = []
    unreadable: dict[str, str] = {}
    for rel in _walk(root):
        path = root.joinpath(*rel.split("/"))
        try:
            if not stat.S_ISREG(os.lstat(path).st_mode):
                odd.append(rel)
                continue
            fd = os.open(path, _FLAGS)
            with open(fd, "rb", buffering=0) as f:
                if not stat.S_ISREG(os.fstat(fd).st_mode):
                    odd.append(rel)
                    continue
                small = rel in kept and os.fstat(fd).st_size <= JSON_MAX_BYTES
                files[rel] = _read_kept(f, names) if small else _read(f, names)
        except OSError as exc:
            if exc.errno == errno.ELOOP:  # became a link after the listing
                odd.append(rel)
                continue
            unreadable[rel] = str(exc.strerror or exc)
    return BundleScan(names, dict(sorted(files.items())), sorted(odd), unreadable)


_FLAGS = os.O_RDONLY | os.O_CLOEXEC | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0)


def _read_kept(src: BinaryIO, names: Sequence[str]) -> Scanned:
    """:func:`_read`, keeping the bytes read (at most JSON_MAX_BYTES + 1)."""
    data = src.read(JSON_MAX_BYTES + 1)
    hashers = [new_hasher(a) for a in names]
    for h in hashers:
        h.update(memoryview(data))
    return Scanned(len(data), {a: h.hexdigest() for a, h in zip(names, hashers, strict=True)},
                   data)


def _names(algorithms: Sequence[str]) -> tuple[str, ...]:
    return (ALGORITHM, *[a for a in dict.fromkeys(algorithms) if a != ALGORITHM])


def _read(src: BinaryIO, names: Sequence[str]) -> Scanned:
    """One pass over ``src`` into a hasher per algorithm."""
    hashers = [new_hasher(a) for a in names]
    size = feed(src, hashers)
    return Scanned(size, {a: h.hexdigest() for a, h in zip(names, hashers, strict=True)})


def check_integrity(bundle: Bundle, scan: BundleScan | None = None) -> IntegrityReport:
    """Check every file of ``bundle`` against its file table (size, xxh3-128) and the manifest
    against its dossier id. Names every missing, extra or altered file. ``scan`` is a
    :func:`scan_bundle` of this bundle made already (by the signature check); without it the
    bundle is scanned now. An archive opened lazily is checked member by member inside the
    archive, writing nothing (its member headers, sizes and count were checked against the
    table when it was opened)."""
    if scan is None:
        scan = scan_bundle(bundle)
    root = bundle.path
    m = bundle.manifest
    problems: list[Problem] = []
    actual = body_digest(bundle.raw)
    if actual != m.dossier_id:
        problems.append(Problem(MANIFEST_NAME, ProblemKind.ALTERED,
                                f"its content no longer matches its dossier id {m.dossier_id}"))
    table = m.table()
    if bundle.archive is not None:  # an archive opened lazily: its members, hashed in place
        got = scan.digests(ALGORITHM)
        problems += [Problem(rel, ProblemKind.ALTERED, f"xxh3-128 {got[rel]}, the manifest says "
                             f"{entry.digest}") for rel, entry in table.items()
                     if got.get(rel) != entry.digest]
        problems.sort(key=lambda p: (p.path, p.kind.value))
        return IntegrityReport(m.dossier_id, len(table), problems)
    if bundle.written is not None:  # copied or extracted by this process: the scan is the truth
        for rel, entry in table.items():
            found = scan.files.get(rel)
            if rel in scan.odd:
                problems.append(Problem(rel, ProblemKind.ALTERED, "not a regular file"))
            elif rel in scan.unreadable:
                problems.append(Problem(rel, ProblemKind.ALTERED,
                                        f"unreadable: {scan.unreadable[rel]}"))
            elif found is None:
                problems.append(Problem(rel, ProblemKind.MISSING))
            elif found.size != entry.size:
                problems.append(Problem(rel, ProblemKind.ALTERED, f"{found.size} bytes, the "
                                        f"manifest says {entry.size}"))
            elif found.digests[ALGORITHM] != entry.digest:
                problems.append(Problem(rel, ProblemKind.ALTERED, f"xxh3-128 "
                                        f"{found.digests[ALGORITHM]}, the manifest says "
                                        f"{entry.digest}"))
    on_disk = {} if bundle.written is not None else table  # else: checked above
    for rel, entry in on_disk.items():
        why = _check_file(root, rel, entry.size, entry.digest, scan)
        if why is not None:
            problems.append(Problem(rel, *why))
    for rel in sorted({*scan.files, *scan.odd, *scan.unreadable}):
        if rel != MANIFEST_NAME and rel not in table:
            problems.append(Problem(rel, ProblemKind.EXTRA, "not in the manifest's file table"))
    problems.sort(key=lambda p: (p.path, p.kind.value))
    return IntegrityReport(m.dossier_id, len(table), problems)


def _check_file(root: Path, rel: str, size: int, digest: str,
                scan: BundleScan) -> tuple[ProblemKind, str] | None:
    if rel in scan.odd:
        return ProblemKind.ALTERED, "not a regular file"
    if rel in scan.unreadable and rel not in scan.files:
        return ProblemKind.ALTERED, f"unreadable: {scan.unreadable[rel]}"
    parts = rel.split("/")
    for i in range(1, len(parts)):  # a folder on the way must be a real folder, not a link
        try:
            st = os.lstat(root.joinpath(*parts[:i]))
        except FileNotFoundError:
            return ProblemKind.MISSING, ""
        if not stat.S_ISDIR(st.st_mode):
            return ProblemKind.ALTERED, f"{'/'.join(parts[:i])} is not a folder"
    path = root.joinpath(*parts)
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return ProblemKind.MISSING, ""
    if not stat.S_ISREG(st.st_mode):
        return ProblemKind.ALTERED, "not a regular file"
    if st.st_size != size:
        return ProblemKind.ALTERED, f"{st.st_size} bytes, the manifest says {size}"
    if rel in scan.unreadable:
        return ProblemKind.ALTERED, f"unreadable: {scan.unreadable[rel]}"
    found = scan.files.get(rel)
    if found is None:  # appeared after the scan
        return ProblemKind.ALTERED, "changed while it was checked"
    if found.size != size:
        return ProblemKind.ALTERED, f"{found.size} bytes, the manifest says {size}"
    got = found.digests[ALGORITHM]
    if got != digest:
        return ProblemKind.ALTERED, f"xxh3-128 {got}, the manifest says {digest}"
    return None


def _walk(root: Path) -> list[str]:
    """Every non-folder entry under ``root`` (links included, never followed), and every
    link to a folder, as bundle-relative POSIX paths."""
    out = []
    for folder, dirs, files in os.walk(root, followlinks=False):
        base = Path(folder).relative_to(root)
        for name in files:
            out.append((base / name).as_posix())
        for name in dirs:
            if os.path.islink(os.path.join(folder, name)):
                out.append((base / name).as_posix())
    return sorted(out)


def require_intact(bundle: Bundle, refused: str = "", scan: BundleScan | None = None,
                   source: object = None) -> None:
    """IntegrityError unless ``bundle`` passes :func:`check_integrity`: the line names the
    bundle (``source``: another name for it), its first problem and what was refused
    (``not signed``, ``not pushed``...)."""
    report = check_integrity(bundle, scan)
    if not report:
        first = report.problems[0] if report.problems else report
        raise IntegrityError(f"{source or bundle.source} fails its integrity check ({first})"
                             + (f"; {refused}" if refused else ""))
