"""Exclusive locks on a run folder and on a bundle being written.

Two ``dossier tune`` (or ``release``) into one run folder would interleave their trial records
and overwrite each other's engines; two writers of one bundle race for its name. A
:class:`FolderLock` is an ``flock`` on a lock file that holds the holder's pid, host and start
time. The kernel releases an ``flock`` when its process dies however it dies (kill -9
included), so a lock left by a killed process is simply free: the next command takes it over
and rewrites the holder line. Nothing is ever decided from the pid alone, so a reused pid
cannot make a live lock look stale or a dead one look held.

The lock file is removed on release. To stay exclusive across that removal, a taker checks
after ``flock`` that the path still names the inode it locked, and starts again when not.

A second command refuses at once with :class:`~dossier.errors.BusyError` (exit 75), naming the
holder: ``... is locked by dossier pid 4242 on host-a since 2026-01-01T10:00:00+00:00``.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import errno
import fcntl
import json
import os
import platform
from collections.abc import Iterator
from pathlib import Path

from dossier.diskfull import host_io, is_disk_full
from dossier.errors import BusyError, OutputError

RUN_LOCK = ".dossier.lock"
"""The lock file of a run folder."""
_HELD: dict[str, int] = {}
"""Locks this process holds (real path -> depth): taking one again nests instead of refusing
(``dossier release`` holds its run folder across tune and bundle)."""


class FolderLock:
    """An exclusive, non-blocking lock held through the lock file ``path``."""

    def __init__(self, path: Path, what: str, *, read_only_ok: bool = False) -> None:
        self.path = Path(path)
        self.what = what
        self.read_only_ok = read_only_ok
        """When the folder is on a read-only file system nobody can change it: go on unlocked."""
        self._fd: int | None = None
        self._key = os.path.realpath(self.path)
        self._nested = False

    def acquire(self) -> FolderLock:
        """Take the lock, or raise BusyError naming its holder."""
        if _HELD.get(self._key):
            _HELD[self._key] += 1
            self._nested = True
            return self
        for _ in range(100):  # a holder removing the file between our open and flock: retry
            try:
                with host_io(self.path.parent, f"locking {self.what}"):
                    fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC
                                 | getattr(os, "O_NOFOLLOW", 0), 0o644)
            except OSError as exc:
                if self.read_only_ok and exc.errno == errno.EROFS:
                    return self
                raise OutputError(f"cannot create the lock file {self.path}: "
                                  f"{exc.strerror or exc}") from exc
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = _read_holder(fd)
                os.close(fd)
                raise BusyError(f"{self.what} is locked by {holder}") from None
            except BaseException:
                os.close(fd)
                raise
            try:
                same = os.fstat(fd).st_ino == os.stat(self.path, follow_symlinks=False).st_ino
            except FileNotFoundError:
                same = False
            if not same:  # removed (and maybe re-created) by the holder we waited on
                os.close(fd)
                continue
            self._fd = fd
            _HELD[self._key] = 1
            self._write_holder()
            return self
        raise BusyError(f"{self.what} is being locked and unlocked by other processes")

    def _write_holder(self) -> None:
        assert self._fd is not None
        line = json.dumps({"pid": os.getpid(), "host": platform.node(),
                           "started_at": dt.datetime.now(dt.timezone.utc)
                           .isoformat(timespec="seconds")}) + "\n"
        with contextlib.suppress(OSError):  # the holder line is information, the flock is the lock
            os.ftruncate(self._fd, 0)
            os.pwrite(self._fd, line.encode(), 0)

    def release(self) -> None:
        """Remove the lock file and release the lock (idempotent)."""
        if self._nested:
            _HELD[self._key] -= 1
            self._nested = False
            return
        if self._fd is None:
            return
        _HELD.pop(self._key, None)
        with contextlib.suppress(OSError):
            self.path.unlink()
        os.close(self._fd)  # closing releases the flock
        self._fd = None

    def __enter__(self) -> FolderLock:
        return self.acquire()

    def __exit__(self, *_: object) -> None:
        self.release()


def _read_holder(fd: int) -> str:
    try:
        data = json.loads(os.pread(fd, 4096, 0) or b"{}")
        pid, host, since = data.get("pid"), data.get("host"), data.get("started_at")
    except (OSError, ValueError, AttributeError):
        pid = host = since = None
    if not isinstance(pid, int):
        return "another dossier process (it has not written its pid yet)"
    where = f" on {host}" if isinstance(host, str) and host else ""
    when = f" since {since}" if isinstance(since, str) and since else ""
    return f"dossier pid {pid}{where}{when}"[:300]


@contextlib.contextmanager
def run_folder_lock(run_dir: Path, *, read_only_ok: bool = False) -> Iterator[FolderLock]:
    """Hold the run folder's lock (the folder must exist) for the ``with`` block; with
    ``read_only_ok`` (readers such as ``bundle``) a folder on a read-only file system is read
    unlocked, as nobody can change it."""
    with FolderLock(Path(run_dir) / RUN_LOCK, f"run folder {run_dir}",
                    read_only_ok=read_only_ok) as lock:
        yield lock


@contextlib.contextmanager
def new_or_locked_run_folder(run_dir: Path) -> Iterator[FolderLock]:
    """Create ``run_dir`` (and its missing parents) when needed and hold its lock for the
    ``with`` block. Folders created here are removed again when the block fails while they are
    still empty (bad input writes nothing, not even an empty run folder or ``OUT/.runs``)."""
    run_dir = Path(run_dir)
    created = [p for p in (run_dir, *run_dir.parents) if not os.path.lexists(p)]
    _mkdir(run_dir)
    try:
        with run_folder_lock(run_dir) as lock:
            yield lock
    except BaseException:
        with contextlib.suppress(OSError):  # deepest first; a folder not empty stops it
            for folder in created:
                folder.rmdir()
        raise


def _mkdir(folder: Path) -> None:
    with host_io(folder, f"creating {folder}"):
        try:
            folder.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            if is_disk_full(exc):
                raise
            raise OutputError(f"cannot write to {folder}: {exc.strerror or exc}") from exc


@contextlib.contextmanager
def bundle_lock(out_dir: Path, name: str) -> Iterator[FolderLock]:
    """Hold the lock of bundle ``out_dir/name`` being written (``out_dir`` must exist)."""
    out_dir = Path(out_dir)
    _mkdir(out_dir)
    with FolderLock(out_dir / f".{name}.lock", f"bundle {out_dir / name}") as lock:
        yield lock
