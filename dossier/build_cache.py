"""The build cache: engines kept across searches, keyed by everything their build depends on.

A search with a build cache (``dossier tune --build-cache DIR``) looks every build job up before
starting it. The key is the xxh3-128 of the build's identity (:class:`BuildIdentity`): the
backend and the versions of its libraries, the build-relevant facts of the host (CPU model and
flags, GPU models and compute capabilities, CUDA runtime, C++ compiler), the model's digest, the
builder settings, the shape entries and the build-time knob values. A hit copies the engine
into the run instead of building it; a finished build is stored for the next search. What the
cache saves is build time only: every engine taken from it is loaded, judged on the validation
set and timed like a fresh one, and its trial records that it came from the cache
(``build_cache`` = ``hit``) with the build time the engine originally took.

Layout: ``DIR/<key>/entry.json`` (:class:`BuildCacheEntry`) and ``DIR/<key>/engine<suffix>``,
written in a staging folder and renamed into place whole, so a reader sees a complete entry or
none, and two searches storing the same key at once keep one.

Everything read back is checked before use: the folder, and every entry folder in it, must
belong to this user and be writable by no one else (as ssh asks of its keys: an engine is code
the process will run; an entry folder that is a link is refused too), entries and engines must
be regular files (never links; a FIFO or a device is a miss, opened without blocking), the
entry must parse, name its own key and the
identity asked for, and the copied engine must have the recorded size and digest. An entry that
fails any check is a miss, and is replaced by the next build of its key. The digest detects
corruption, not forgery: whoever may write the folder may plant engines, hence the ownership
rule. A cache that cannot be written (a full disk) costs the next search its builds, nothing
else: the search goes on and says so in its notes.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import logging
import os
import shutil
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Any, BinaryIO, Literal

from pydantic import BaseModel, ConfigDict, ValidationError

from dossier.errors import InputError
from dossier.files import (
    copy_hashed,
    fsync_path,
    link_or_copy_hashed,
    new_staging,
    remove_stale_staging,
    rename_noreplace,
    write_durable,
)
from dossier.hashing import digest_json, digest_stream
from dossier.names import folder_problem
from dossier.version import __version__

logger = logging.getLogger(__name__)

ENV = "DOSSIER_BUILD_CACHE"
"""Environment variable naming the build cache folder when ``--build-cache`` is not given."""
ENTRY = "entry.json"
ENGINE = "engine"
MAX_ENTRY_BYTES = 1 << 20
"""An entry larger than this is not read (a crafted file must not exhaust memory)."""


class BuildIdentity(BaseModel):
    """Everything a build's output depends on (hashed into the key)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    cache_format: Literal[1] = 1
    backend: str
    tuner_version: str
    """The compiler's version as the knob database names it."""
    stack: dict[str, str]
    """Versions of the libraries the backend runs on (:meth:`Backend.stack`)."""
    host: dict[str, Any]
    """Build-relevant host facts (:func:`host_identity`)."""
    model_digest: str
    builder: dict[str, Any] = {}
    shapes: list[dict[str, Any]] = []
    build_knobs: list[tuple[str, str]]
    """The route's effective build-time knob values, sorted."""
    engine_suffix: str
    calibration: str | None = None
    """The calibration set's digest, for a build that read one (static quantization)."""

    def key(self) -> str:
        """The cache key: xxh3-128 of the identity's canonical JSON (``calibration`` left out
        when the build read none, so keys of builds without one are what they were)."""
        data = self.model_dump(mode="json")
        if data["calibration"] is None:
            del data["calibration"]
        return digest_json(data)


class BuildCacheEntry(BaseModel):
    """``entry.json``: what was built, from what, and how long it took."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    key: str
    identity: BuildIdentity
    engine_digest: str
    engine_size: int
    build_s: float
    """The build's own time when it was made (paused time left out)."""
    facts: dict[str, str] = {}
    """The build's facts (as its trial records them)."""
    created_at: str
    tool_version: str


def host_identity(fp: Any) -> dict[str, Any]:
    """The facts of a :class:`~dossier.fingerprint.Fingerprint` that a build can depend on:
    CPU model and instruction-set flags (a CPU engine may use any instruction the host has), the
    machine type and C library, GPU models and compute capabilities, CUDA runtime, cuDNN, the C++ compiler
    and how it links libstdc++, and TensorRT's internal switches. Never volatile facts (time,
    host name, clocks, board serials)."""
    return {
        "cpu": {"model": fp.cpu.model, "vendor": fp.cpu.vendor, "isa_flags": fp.cpu.isa_flags},
        "machine": fp.os.machine, "glibc": fp.os.glibc,
        "gpus": [list(g) for g in sorted({(g.name or "", g.compute_capability or "")
                                          for g in fp.gpus})],
        "cuda_runtime": fp.cuda_runtime, "cudnn": fp.cudnn,
        "compiler": fp.compiler, "compiler_path": fp.compiler_path,
        "compiler_libstdcxx": fp.compiler_libstdcxx,
        "trt_internal_options": fp.trt_internal_options,
    }


class BuildCache:
    """One build cache folder (see the module's documentation)."""

    def __init__(self, folder: Path) -> None:
        """Create ``folder`` if needed and check that only this user may write it; InputError
        (exit 3) otherwise, before any search starts."""
        self.folder = Path(folder)
        self.notes: list[str] = []
        """What went wrong while storing (the search goes on without it)."""
        self.hits = 0
        self.stored = 0
        try:
            self.folder.mkdir(parents=True, exist_ok=True, mode=0o700)
        except OSError as exc:
            raise InputError(f"--build-cache {self.folder}: cannot create it: "
                             f"{exc.strerror or exc}") from exc
        problem = folder_problem(self.folder)
        if problem is not None and "not a folder" in problem:
            raise InputError(f"--build-cache {self.folder} {problem}",
                             hint="give a folder of your own for the build cache")
        if problem is not None:
            raise InputError(
                f"--build-cache {self.folder} {problem}: an engine taken from it is code this "
                "host runs", hint=f"use a folder of your own, or chmod go-w {self.folder}")
        remove_stale_staging(self.folder)  # what killed writers left

    def get(self, identity: BuildIdentity, dest: Path) -> BuildCacheEntry | None:
        """Copy the engine stored for ``identity`` to the new file ``dest`` and return its
        entry; None (and no ``dest``) when there is none or it fails a check."""
        key = identity.key()
        entry = self._entry(key)  # checked: its folder, it names this key, its identity
        if entry is None:
            logger.debug("build cache %s: no entry %s", self.folder, key)
            return None
        src = self.folder / key / (ENGINE + identity.engine_suffix)
        try:
            with _open_regular(src) as f:
                if f is None or os.fstat(f.fileno()).st_size != entry.engine_size:
                    return None
                dest.unlink(missing_ok=True)
                digest, size = copy_hashed(f, dest)  # checks the bytes it copied
        except OSError:
            dest.unlink(missing_ok=True)
            return None
        if digest != entry.engine_digest or size != entry.engine_size:
            dest.unlink(missing_ok=True)
            return None
        self.hits += 1
        logger.info("build cache hit: %s copied to %s", self.folder / key, dest)
        return entry

    def _entry(self, key: str) -> BuildCacheEntry | None:
        """The entry stored under ``key``, if its folder is this user's alone (the top folder's
        rule), it parses, names ``key`` and its identity hashes to ``key``."""
        if folder_problem(self.folder / key) is not None:
            return None
        try:
            with _open_regular(self.folder / key / ENTRY) as f:
                if f is None:
                    return None
                data = f.read(MAX_ENTRY_BYTES + 1)
        except OSError:
            return None
        if len(data) > MAX_ENTRY_BYTES:
            return None
        try:
            entry = BuildCacheEntry.model_validate_json(data)
        except ValidationError:
            return None
        if entry.key != key or entry.identity.key() != key:
            return None
        return entry

    def _whole(self, key: str, suffix: str) -> bool:
        """The entry of ``key`` passes its checks and its engine has the recorded bytes."""
        entry = self._entry(key)
        if entry is None:
            return False
        with _open_regular(self.folder / key / (ENGINE + suffix)) as f:
            return f is not None and digest_stream(f) == (entry.engine_digest, entry.engine_size)

    def put(self, identity: BuildIdentity, engine: Path, build_s: float,
            facts: dict[str, Any]) -> bool:
        """Store ``engine`` for ``identity``; False (with a note) when it could not be stored.
        An existing entry that passes its checks is kept; one that fails them is replaced."""
        key = identity.key()
        final = self.folder / key
        staging: Path | None = None
        try:
            if os.path.lexists(final):
                if self._whole(key, identity.engine_suffix):
                    return True  # another search stored it first
                _remove(final)
            staging = new_staging(self.folder, key, directory=True)
            digest, size = link_or_copy_hashed(engine, staging / (ENGINE + identity.engine_suffix))
            entry = BuildCacheEntry(
                key=key, identity=identity, engine_digest=digest, engine_size=size,
                build_s=build_s, facts={k: str(v) for k, v in facts.items()},
                created_at=dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
                tool_version=__version__)
            write_durable(staging / ENTRY, entry.model_dump_json(indent=2).encode())
            fsync_path(staging)
            try:
                rename_noreplace(staging, final)
            except FileExistsError:
                return True  # stored by another search meanwhile
            staging = None
            fsync_path(self.folder)
        except OSError as exc:
            self.notes.append(f"build cache {self.folder}: could not store a build "
                              f"({exc.strerror or exc}); the next search rebuilds it")
            return False
        finally:
            if staging is not None:
                shutil.rmtree(staging, ignore_errors=True)
        self.stored += 1
        logger.info("build cache: stored %s as %s", engine, final)
        return True


@contextlib.contextmanager
def _open_regular(path: Path) -> Iterator[BinaryIO | None]:
    """``path`` opened for reading, never through a link; None when it is missing, a link or
    not a regular file."""
    try:
        # O_NONBLOCK: a FIFO planted under the name must not block the open (it is then no
        # regular file: a miss); it changes nothing for a regular file
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        yield None
        return
    with os.fdopen(fd, "rb", buffering=0) as f:
        yield f if stat.S_ISREG(os.fstat(f.fileno()).st_mode) else None


def _remove(path: Path) -> None:
    """Remove a bad entry (a folder, or whatever was planted under its name)."""
    if os.path.isdir(path) and not os.path.islink(path):
        # renamed aside first (a staging name: a kill leaves it to the next clean-up), so a
        # reader never sees a half-removed entry
        aside = new_staging(path.parent, path.name, directory=False)
        os.rename(path, aside)
        shutil.rmtree(aside, ignore_errors=True)
    else:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)


def open_build_cache(folder: str | Path | None) -> BuildCache | None:
    """The build cache at ``folder``, or at :data:`ENV` when None; None when neither is set."""
    chosen = folder if folder is not None else os.environ.get(ENV) or None
    return BuildCache(Path(chosen)) if chosen is not None else None


__all__ = ["ENV", "BuildCache", "BuildCacheEntry", "BuildIdentity", "host_identity",
           "open_build_cache"]
