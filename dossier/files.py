"""Durable file writes: streamed copy-and-hash, fsynced new files, no-replace renames, staging
entries and their clean-up.

The writers of outputs (bundles, archives, signatures, keys, validation sets, pulled blobs,
reports, schemas, the build cache) write through these: a new file is written exclusively
(``xb``) and fsynced, a finished staging entry is renamed into place without replacing what is
there (:func:`rename_noreplace`) and its folder fsynced, so a kill or a crash leaves either the
old state or the new one, and at most a staging entry that the next writer removes
(:func:`remove_stale_staging`). What a full disk means is :mod:`dossier.diskfull`'s.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import re
import secrets
import shutil
import stat
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import BinaryIO

from dossier.diskfull import output_error
from dossier.hashing import ALGORITHM, CHUNK, digest_stream, feed, new_hasher

STAGING_MARK = ".staging-"
"""Staging entries are named ``.<final name>.staging-<pid>-<random>`` next to their target."""
_STAGING = re.compile(r"^\..+\.staging-(?P<pid>\d+)-[0-9a-f]+$")


class _Tee:
    """A readable stream that writes everything read from ``src`` to ``dst``."""

    def __init__(self, src: BinaryIO, dst: BinaryIO, limit: int | None = None) -> None:
        self.src, self.dst, self.left = src, dst, limit

    def readinto(self, buf: bytearray) -> int:
        view = memoryview(buf)
        if self.left is not None:
            view = view[: min(len(view), self.left)]
        n = self.src.readinto(view) if hasattr(self.src, "readinto") else _read_into(self.src, view)
        if n:
            self.dst.write(view[:n])
            if self.left is not None:
                self.left -= n
        return n or 0


def _read_into(src: BinaryIO, view: memoryview) -> int:
    data = src.read(len(view))
    view[: len(data)] = data
    return len(data)


def copy_digests(src: BinaryIO, dst_path: Path, algorithms: Sequence[str],
                 limit: int | None = None, *, mode: int = 0o666,
                 sync: bool = True) -> tuple[dict[str, str], int]:
    """Copy ``src`` (at most ``limit`` bytes) into the new file ``dst_path``, fsynced; return
    the digest by algorithm (each of ``algorithms``, see :func:`dossier.hashing.new_hasher`) of
    what was written, and its size. One read; memory use is one fixed buffer. ``mode``: the
    new file's permissions (less the umask; :data:`PRIVATE_FILE` is owner-only whatever the
    umask). ``sync=False``: not fsynced (a temporary copy that no crash needs to find)."""
    hashers = {a: new_hasher(a) for a in algorithms}
    with _create(dst_path, mode) as dst:
        size = feed(_Tee(src, dst, limit), list(hashers.values()))  # type: ignore[arg-type]
        dst.flush()
        if sync:
            os.fsync(dst.fileno())
    return {a: h.hexdigest() for a, h in hashers.items()}, size


def copy_hashed(src: BinaryIO, dst_path: Path, limit: int | None = None) -> tuple[str, int]:
    """Copy ``src`` (at most ``limit`` bytes) into the new file ``dst_path``, fsynced;
    return its xxh3-128 and size. Memory use is one fixed buffer."""
    digests, size = copy_digests(src, dst_path, [ALGORITHM], limit)
    return digests[ALGORITHM], size


def copy_file_hashed(src: Path, dst: Path) -> tuple[str, int]:
    """Copy the file ``src`` to the new file ``dst``; return the digest and size of what was
    copied (read once)."""
    with open(src, "rb", buffering=0) as f:
        return copy_hashed(f, dst)


def link_or_copy_hashed(src: Path, dst: Path) -> tuple[str, int]:
    """Make the new file ``dst`` hold ``src``'s bytes, fsynced: a hard link where the file system
    allows one (no bytes copied: a 440 MB engine took 0.95 s to copy here), else a copy; return
    the digest and size of what ``dst`` holds. The two names share one file after a link:
    for files nothing writes once made, whose every reader checks the digest."""
    try:
        os.link(src, dst, follow_symlinks=False)
    except OSError:
        return copy_file_hashed(src, dst)
    with open(dst, "rb", buffering=0) as f:
        os.fsync(f.fileno())
        return digest_stream(f)


def write_durable(path: Path, data: bytes, *, mode: int = 0o666) -> None:
    """Write the new file ``path`` (``mode`` less the umask) and fsync it."""
    with _create(path, mode) as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def replace_small(path: Path, data: bytes, *, suffix: str = ".tmp") -> None:
    """Replace ``path`` by a file holding ``data``, atomically for a reader: written beside it
    (``path`` + ``suffix``), then renamed over it. The temporary file never stays behind,
    even on a full disk. Not fsynced: for files a crash may lose (requests, results, records
    rewritten whole), not for what must outlast one (:func:`write_durable`)."""
    tmp = path.with_name(path.name + suffix)
    try:
        tmp.write_bytes(data)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def _create(path: Path, mode: int) -> BinaryIO:
    """The new file ``path`` opened for writing (never an existing one, never through a link)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC | _NOFOLLOW, mode)
    return open(fd, "wb")


PRIVATE_FILE = 0o600
"""Permissions of a file only this process's user may read or write (umask or not)."""
PRIVATE_FOLDER = 0o700
"""Permissions of a folder only this process's user may enter."""
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_NONBLOCK = getattr(os, "O_NONBLOCK", 0)
SMALL_FILE_MAX = 64 << 20
"""Default cap of :func:`read_small`: a key, a signature, a fingerprint, a policy, a spec."""


class NotAFileError(OSError):
    """What :func:`read_small` raises for a path that is not a regular file of bounded size
    (an OSError, so that a caller's ``except OSError`` says it in its own words)."""


def read_small(path: str | os.PathLike[str], limit: int = SMALL_FILE_MAX, *,
               follow: bool = True) -> bytes:
    """The bytes of the small file ``path``, read once. It is opened without blocking (a FIFO,
    a socket or a device never makes this wait) and checked, on the open descriptor, to be a
    regular file of at most ``limit`` bytes before a byte is read; more than ``limit`` bytes
    read (a file that grew meanwhile) is refused too. With ``follow=False`` a symbolic link is
    refused. Raises OSError (:class:`NotAFileError` for what is not a regular file, or too
    large), whose ``strerror`` says why in a few words."""
    flags = os.O_RDONLY | os.O_CLOEXEC | _NONBLOCK | (0 if follow else _NOFOLLOW)
    try:
        fd = os.open(path, flags)
    except OSError as exc:
        if exc.errno == errno.ELOOP and not follow:
            raise NotAFileError(errno.ELOOP, "a symbolic link, not a regular file",
                                str(path)) from None
        raise
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise NotAFileError(errno.EINVAL, f"not a regular file ({_kind(info.st_mode)})",
                                str(path))
        if info.st_size > limit:
            raise NotAFileError(errno.EFBIG, f"{info.st_size} bytes, more than the "
                                f"{limit} allowed", str(path))
        chunks, size = [], 0
        while size <= limit and (chunk := os.read(fd, limit + 1 - size)):
            chunks.append(chunk)
            size += len(chunk)
        data = b"".join(chunks)
    finally:
        os.close(fd)
    if len(data) > limit:
        raise NotAFileError(errno.EFBIG, f"more than the {limit} bytes allowed", str(path))
    return data


def _kind(mode: int) -> str:
    for test, name in ((stat.S_ISDIR, "a folder"), (stat.S_ISFIFO, "a FIFO"),
                       (stat.S_ISSOCK, "a socket"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISLNK, "a symbolic link")):
        if test(mode):
            return name
    return "not a file"


def fsync_path(path: Path) -> None:
    """fsync a file or folder (folders: so a rename or a new entry survives a crash)."""
    flags = os.O_RDONLY | (os.O_DIRECTORY if path.is_dir() else 0)
    fd = os.open(path, flags)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_tree(root: Path) -> None:
    """fsync every folder under ``root`` (files are fsynced when written)."""
    for folder, _, _ in os.walk(root):
        fsync_path(Path(folder))


_RENAME_NOREPLACE = 1
_AT_FDCWD = -100


def rename_noreplace(src: Path, dst: Path) -> None:
    """Rename ``src`` to ``dst``, atomically, failing with FileExistsError if ``dst`` exists.

    Uses renameat2(RENAME_NOREPLACE) where the kernel and C library have it (Linux); elsewhere a
    check right before rename() (a narrow race, documented)."""
    libc = _libc()
    fn = getattr(libc, "renameat2", None) if libc is not None else None
    if fn is not None:
        rc = fn(_AT_FDCWD, os.fsencode(src), _AT_FDCWD, os.fsencode(dst), _RENAME_NOREPLACE)
        if rc == 0:
            return
        err = ctypes.get_errno()
        if err == errno.EEXIST or (err == errno.ENOTEMPTY):
            raise FileExistsError(errno.EEXIST, os.strerror(errno.EEXIST), str(dst))
        if err not in (errno.ENOSYS, errno.EINVAL):
            raise OSError(err, os.strerror(err), str(dst))
    if os.path.lexists(dst):
        raise FileExistsError(errno.EEXIST, os.strerror(errno.EEXIST), str(dst))
    os.rename(src, dst)


def _libc() -> ctypes.CDLL | None:
    try:
        return ctypes.CDLL(None, use_errno=True)
    except OSError:  # pragma: no cover - no C library to ask
        return None


def new_staging(folder: Path, final_name: str, *, directory: bool) -> Path:
    """Create a staging entry for ``final_name`` in ``folder`` (same file system as the target)."""
    path = folder / f".{final_name}{STAGING_MARK}{os.getpid()}-{secrets.token_hex(4)}"
    if directory:
        path.mkdir()
    return path


def begin_staging(out_dir: Path, final_name: str, *, directory: bool) -> Path:
    """Create ``out_dir`` if needed, remove what killed writers left there, and return a new
    staging entry for ``final_name``. OutputError when ``out_dir`` cannot be created."""
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise output_error(exc, out_dir, f"creating {out_dir}", f"create {out_dir}") from exc
    remove_stale_staging(out_dir)
    return new_staging(out_dir, final_name, directory=directory)


def remove_stale_staging(folder: Path) -> list[Path]:
    """Remove staging entries in ``folder`` whose writer process is gone; return them."""
    return remove_stale(folder, _STAGING)


def remove_stale(folder: Path, pattern: re.Pattern[str], *, older_than_s: float = 0.0,
                 dirs_only: bool = False) -> list[Path]:
    """Remove the entries of ``folder`` whose name matches ``pattern`` (with a ``pid`` group)
    and whose process is gone, untouched for ``older_than_s``; only folders with ``dirs_only``
    (never following a symbolic link). Returns them."""
    removed: list[Path] = []
    now = time.time()
    try:
        entries = list(Path(folder).iterdir())
    except OSError:
        return removed
    for entry in entries:
        m = pattern.match(entry.name)
        if not m or _alive(int(m["pid"])):
            continue
        try:
            st = entry.lstat()
        except OSError:
            continue
        is_dir = stat.S_ISDIR(st.st_mode)
        if (dirs_only and not is_dir) or now - st.st_mtime < older_than_s:
            continue
        if is_dir:
            shutil.rmtree(entry, ignore_errors=True)
        else:
            with contextlib.suppress(OSError):
                entry.unlink()
        removed.append(entry)
    return removed


def _alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


__all__ = ["CHUNK", "PRIVATE_FILE", "PRIVATE_FOLDER", "SMALL_FILE_MAX", "STAGING_MARK",
           "NotAFileError", "read_small", "begin_staging", "copy_digests", "copy_file_hashed",
           "copy_hashed", "fsync_path", "fsync_tree", "new_staging", "remove_stale",
           "remove_stale_staging", "rename_noreplace", "write_durable"]


def write_new_folder(out: Path, fill: Callable[[Path], None], what: str) -> None:
    """Write the new folder ``out`` whole or not at all: ``fill(stage)`` writes its content
    into a staging folder beside it (a killed writer's is removed first), which is fsynced and
    renamed into place without replacing anything. OutputError when ``out`` appeared meanwhile
    or cannot be written (DiskFullError when the disk is full); the staging folder never stays."""
    from dossier.errors import OutputError

    stage = begin_staging(out.parent, out.name, directory=True)
    try:
        fill(stage)
        fsync_tree(stage)
        rename_noreplace(stage, out)
    except FileExistsError:
        raise OutputError(f"{out} appeared while the {what} was written") from None
    except OSError as exc:
        raise output_error(exc, out.parent, f"writing {out.name}", f"write {out}") from exc
    finally:
        shutil.rmtree(stage, ignore_errors=True)

