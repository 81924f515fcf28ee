"""Files the quantizing builds of one search share in its build scratch folder.

A file is a function of a key (what it was made from): the model after ``quant_pre_process``,
the activation ranges a calibration computed. The first build to need one makes it and keeps
it as ``KIND-KEY-DIGEST.SUFFIX`` beside a pointer ``KIND-KEY.json`` naming it; builds running
at once take turns on ``KIND-KEY.lock`` (an ``flock``), so the second waits for the first's
file instead of making the same one on the other core. Whatever the folder holds is untrusted:
a pointer that does not parse, names another file or disagrees with the file's digest is
ignored, and a folder that cannot be written leaves each build making its own.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import stat
from collections.abc import Iterator
from pathlib import Path

from dossier.files import copy_file_hashed, link_or_copy_hashed, read_small, replace_small
from dossier.hashing import digest_file

_KEY = re.compile(r"[0-9a-f]{32}")


def folder(scratch: Path | None) -> str | None:
    """Where a build makes its temporary folders: ``scratch`` (made if missing) when it is a
    folder of its own, not a link; else None (the system's TMPDIR). A build killed with
    SIGKILL cannot remove its temporary folder: in the scratch folder it goes with the
    search's work folder, and the files it takes from there are on the same file system
    (linked, not copied)."""
    if scratch is None:
        return None
    with contextlib.suppress(OSError):
        scratch.mkdir(parents=True, exist_ok=True)
        if stat.S_ISDIR(os.lstat(scratch).st_mode):
            return str(scratch)
    return None


def _pointer(folder: Path, kind: str, key: str) -> Path:
    if not _KEY.fullmatch(key) or not re.fullmatch(r"[a-z]+", kind):
        raise ValueError(f"not a scratch key: {kind} {key}")
    return folder / f"{kind}-{key}.json"


@contextlib.contextmanager
def one_at_a_time(folder: Path | None, kind: str, key: str) -> Iterator[None]:
    """Hold an exclusive ``flock`` on ``KIND-KEY.lock`` in ``folder`` (made if missing; never
    through a link) while the block runs; without a folder, or where the lock cannot be opened,
    run the block unlocked. The kernel releases the lock when its holder dies, however it
    dies."""
    fd = None
    if folder is not None:
        path = _pointer(folder, kind, key).with_suffix(".lock")
        with contextlib.suppress(OSError):
            folder.mkdir(parents=True, exist_ok=True)
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK, 0o600)
    try:
        if fd is not None:
            fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        if fd is not None:
            os.close(fd)


def _named(folder: Path, kind: str, key: str, suffix: str) -> tuple[Path, str] | None:
    """The file the pointer of ``kind`` and ``key`` names and the digest it records, if the
    pointer parses, names a file of that kind and key, and that file is a regular one (a link,
    a folder or a FIFO planted there is not read: a FIFO would block the build until its
    timeout); else None. The bytes are not checked here."""
    pointer = _pointer(folder, kind, key)
    try:
        doc = json.loads(read_small(pointer, 4096, follow=False))
        name, digest = doc["file"], doc["digest"]
        if not (isinstance(name, str) and isinstance(digest, str)
                and re.fullmatch(rf"{kind}-{key}-[0-9a-f]{{32}}{re.escape(suffix)}", name)
                and name == f"{kind}-{key}-{digest}{suffix}"):
            return None
        path = folder / name
        return (path, digest) if stat.S_ISREG(path.lstat().st_mode) else None
    except (OSError, ValueError, KeyError, TypeError):
        return None


def kept(folder: Path | None, kind: str, key: str, suffix: str) -> Path | None:
    """The file the pointer of ``kind`` and ``key`` names, if it is what the pointer says; else
    None."""
    named = _named(folder, kind, key, suffix) if folder is not None else None
    if named is None:
        return None
    try:
        return named[0] if digest_file(named[0])[0] == named[1] else None
    except OSError:
        return None


def take(folder: Path | None, kind: str, key: str, suffix: str, dest: Path, *,
         link: bool = True) -> bool:
    """Put the kept file of ``kind`` and ``key`` at the new name ``dest`` in the build's own
    folder, its digest checked there (once: on what the build will read); False (and no
    ``dest``) when there is none or it fails a check. A build works on its own name: ONNX
    Runtime's quantizers write files beside their input (``*-inferred.onnx``), which two builds
    reading one shared name at once would write and remove under each other. ``link``: a hard
    link where possible (the file is only read), else a copy; ``link=False`` for a file the
    build may write over."""
    named = _named(folder, kind, key, suffix) if folder is not None else None
    if named is None:
        return False
    got, recorded = named
    try:
        digest, _ = link_or_copy_hashed(got, dest) if link else copy_file_hashed(got, dest)
    except OSError:
        dest.unlink(missing_ok=True)
        return False
    if digest != recorded:
        dest.unlink(missing_ok=True)
        return False
    return True


def keep(made: Path, folder: Path | None, kind: str, key: str, suffix: str) -> None:
    """Copy ``made`` into ``folder`` under its digest, then point at it (each step atomic for a
    reader: two builds doing this at once leave one consistent pair). A copy, not a link: the
    build that made it goes on reading ``made``, which nothing written into the shared folder
    may change. A full disk or a folder that cannot be written: nothing kept."""
    if folder is None:
        return
    pointer = _pointer(folder, kind, key)
    with contextlib.suppress(OSError):
        folder.mkdir(parents=True, exist_ok=True)
        part = folder / f".{kind}-{key}.{os.getpid()}.part"
        part.unlink(missing_ok=True)
        try:
            digest, _ = copy_file_hashed(made, part)
            name = f"{kind}-{key}-{digest}{suffix}"
            os.replace(part, folder / name)
        finally:
            part.unlink(missing_ok=True)
        replace_small(pointer, json.dumps({"file": name, "digest": digest}).encode(),
                      suffix=f".{os.getpid()}.tmp")
