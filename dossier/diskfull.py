"""A full file system is the host's fault, not the route's.

``ENOSPC`` (no space left), ``EDQUOT`` (quota exceeded) and ``EFBIG`` (a file over the size
limit, e.g. ``ulimit -f``) say nothing about a build route, a model or a bundle: a trial that
hits one is not ``build_failed`` or ``crashed``, an extraction that hits one is not a bad
archive. Every place that writes maps them to :class:`~dossier.errors.DiskFullError` (exit 74),
which names the file system, and records nothing about the work it interrupted. Writers of
outputs (bundles, archives, signatures, keys, validation sets, pulled blobs) map every OSError
through :func:`output_error`: a full disk is exit 74, anything else OutputError (exit 7).

A trial's child process reports a full disk with the exit status :data:`DISK_FULL_STATUS`
(its result file, on the same file system, may not be writable); the parent then stops the
search without recording the trial, so ``tune --continue`` runs it again.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

from dossier.errors import DiskFullError, DossierError, OutputError

DISK_FULL_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG})
"""The errors that mean "the host ran out of room"."""
DISK_FULL_STATUS = 74
"""Exit status of a trial process that hit a full disk (sysexits EX_IOERR)."""
_TEXTS = tuple(os.strerror(e) for e in sorted(DISK_FULL_ERRNOS))
"""How native libraries that swallow errno still say it ("No space left on device", ...)."""


def is_disk_full(exc: BaseException | str | None) -> bool:
    """True when ``exc`` (an exception, its causes, or a message) is a full disk."""
    seen = 0
    while isinstance(exc, BaseException) and seen < 8:
        if isinstance(exc, OSError) and exc.errno in DISK_FULL_ERRNOS:
            return True
        if any(t in str(exc) for t in _TEXTS):
            return True
        exc = exc.__cause__ or exc.__context__
        seen += 1
    return isinstance(exc, str) and any(t in exc for t in _TEXTS)


def mount_point(path: Path) -> Path:
    """The mount point of the file system holding ``path`` (or its nearest existing parent)."""
    p = Path(os.path.abspath(path))
    while not p.exists() and p != p.parent:
        p = p.parent
    while not os.path.ismount(p) and p != p.parent:
        p = p.parent
    return p


def describe(path: Path) -> str:
    """``/mnt/runs (tmpfs, 12 KiB free of 100 KiB)``: which file system, of what kind, how full."""
    mount = mount_point(path)
    kind = ""
    with contextlib.suppress(OSError):
        for line in Path("/proc/mounts").read_text().splitlines():
            fields = line.split()
            if len(fields) > 2 and fields[1] == str(mount):
                kind = fields[2]  # the last entry for a mount point is the visible one
    try:
        usage = shutil.disk_usage(mount)
        room = f"{_kib(usage.free)} free of {_kib(usage.total)}"
    except OSError:
        room = "size unknown"
    return f"{mount} ({kind + ', ' if kind else ''}{room})"


def _kib(n: int) -> str:
    for unit, shift in (("GiB", 30), ("MiB", 20)):
        if n >= 1 << shift:
            return f"{n / (1 << shift):.1f} {unit}"
    return f"{n >> 10} KiB"


def disk_full_error(exc: BaseException | str, path: Path, doing: str) -> DiskFullError:
    """The one-line error for a full disk met while ``doing`` something at ``path``."""
    why = exc.strerror if isinstance(exc, OSError) and exc.strerror else None
    if why is None:
        why = next((t for t in _TEXTS if t in str(exc)), "no space left")
    if why == os.strerror(errno.EFBIG):
        return DiskFullError(f"a file in {Path(path)} reached the file size limit (ulimit -f) "
                             f"while {doing}: {why}",
                             hint="raise the limit (ulimit -f) and run the command again")
    return DiskFullError(f"the file system {describe(path)} is full while {doing}: {why}")


def output_error(exc: OSError, where: Path, doing: str, cannot: str) -> DossierError:
    """The one error for ``exc`` met while ``doing`` at ``where``: DiskFullError (exit 74)
    naming the file system when the disk is full (or a file reached the size limit), else
    OutputError (exit 7) ``cannot CANNOT: why``."""
    if is_disk_full(exc):
        return disk_full_error(exc, where, doing)
    return OutputError(f"cannot {cannot}: {exc.strerror or exc}")


@contextlib.contextmanager
def host_io(path: Path, doing: str) -> Iterator[None]:
    """Map a full disk met inside the block to DiskFullError naming ``path``'s file system."""
    try:
        yield
    except OSError as exc:
        if is_disk_full(exc):
            raise disk_full_error(exc, path, doing) from exc
        raise


PROBE_BYTES = 64 << 10
"""Size of the probe write that tells a failure on a full disk from a failure of the route."""


def probe(path: Path) -> OSError | None:
    """After a native library failed to write ``path`` without saying why (ONNX Runtime: "Failed
    to save ... to file"): write and fsync a probe file beside it, larger than what is left of
    ``path`` and than PROBE_BYTES, and return the error when the disk is full (or the file size
    limit is reached). The probe is removed."""
    path = Path(path)
    try:
        size = max(PROBE_BYTES, path.stat().st_size + 1)
    except OSError:
        size = PROBE_BYTES
    spot = path.parent / f".dossier-space-probe-{os.getpid()}"
    try:
        with open(spot, "wb") as f:
            f.truncate(0)
            block = bytes(min(size, 1 << 20))
            left = size
            while left > 0:
                left -= f.write(block[:left])
            f.flush()
            os.fsync(f.fileno())
    except OSError as exc:
        return exc if exc.errno in DISK_FULL_ERRNOS else None
    finally:
        with contextlib.suppress(OSError):
            spot.unlink()
    return None


def check_room(folder: Path, needed: int, doing: str) -> None:
    """DiskFullError, before anything is written, when ``folder``'s file system has less than
    ``needed`` bytes free."""
    try:
        free = shutil.disk_usage(mount_point(folder)).free
    except OSError:
        return
    if free < needed:
        raise DiskFullError(f"the file system {describe(folder)} has no room for {doing} "
                            f"({_kib(needed)} needed)")
