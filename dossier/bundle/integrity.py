"""Integrity: every file of a bundle against the manifest's file table, and the manifest
against its dossier id.

xxh3-128 detects corruption (a flipped bit, a truncated copy, a file edited by mistake); it is
not a cryptographic digest and does not stop someone who wants to forge a bundle. That needs a
signature over the manifest with cryptographic digests of every file.
"""

from __future__ import annotations

import enum
import os
import stat
from dataclasses import dataclass, field
from pathlib import Path

from dossier.bundle.manifest import MANIFEST_NAME, body_digest
from dossier.bundle.reader import Bundle
from dossier.hashing import digest_file, digest_stream


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


def check_integrity(bundle: Bundle) -> IntegrityReport:
    """Check every file of ``bundle`` against its file table (size, then xxh3-128, streamed)
    and the manifest against its dossier id. Names every missing, extra or altered file. An
    archive opened lazily is checked member by member inside the archive, writing nothing (its
    member headers, sizes and count were checked against the table when it was opened)."""
    root = bundle.path
    m = bundle.manifest
    problems: list[Problem] = []
    actual = body_digest(bundle.raw)
    if actual != m.dossier_id:
        problems.append(Problem(MANIFEST_NAME, ProblemKind.ALTERED,
                                f"its content no longer matches its dossier id {m.dossier_id}"))
    table = m.table()
    if bundle.archive is not None:  # an archive opened lazily: its members, hashed in place
        from dossier.bundle.archive import scan_archive

        got = scan_archive(bundle.archive, lambda f: digest_stream(f)[0])
        problems += [Problem(rel, ProblemKind.ALTERED, f"xxh3-128 {got[rel]}, the manifest says "
                             f"{entry.digest}") for rel, entry in table.items()
                     if got.get(rel) != entry.digest]
        problems.sort(key=lambda p: (p.path, p.kind.value))
        return IntegrityReport(m.dossier_id, len(table), problems)
    for rel, entry in table.items():
        why = _check_file(root, rel, entry.size, entry.digest)
        if why is not None:
            problems.append(Problem(rel, *why))
    for rel in _walk(root):
        if rel != MANIFEST_NAME and rel not in table:
            problems.append(Problem(rel, ProblemKind.EXTRA, "not in the manifest's file table"))
    problems.sort(key=lambda p: (p.path, p.kind.value))
    return IntegrityReport(m.dossier_id, len(table), problems)


def _check_file(root: Path, rel: str, size: int, digest: str) -> tuple[ProblemKind, str] | None:
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
    try:
        got, _ = digest_file(path)
    except OSError as exc:
        return ProblemKind.ALTERED, f"unreadable: {exc.strerror}"
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
