"""Content digests: xxh3-128 of files (streamed) and of canonical JSON; one streamed pass that
feeds several hashers (xxh3-128, BLAKE3, SHA-256) at once (:func:`feed`, :func:`new_hasher`).

This is the only module that imports xxhash and blake3. xxh3-128 detects accidental corruption
(a flipped bit, a truncated copy); it is not a cryptographic hash and does not protect against
someone who wants to forge a file with the same digest. Tamper-proofing needs a signature over cryptographic
digests of every file (``dossier sign``).
"""

from __future__ import annotations

import hashlib
import json
import mmap
from collections.abc import Sequence
from pathlib import Path
from typing import IO, Any, Protocol

import xxhash

CHUNK = 1 << 20
"""Read size for streamed hashing: memory use does not depend on the file size."""

ALGORITHM = "xxh3-128"


def digest_bytes(data: bytes) -> str:
    """xxh3-128 of ``data`` as 32 hex digits."""
    return xxhash.xxh3_128_hexdigest(data)


class Hasher(Protocol):
    """What :func:`feed` needs of a hash object (xxhash, hashlib, blake3 all qualify)."""

    def update(self, data: memoryview, /) -> object: ...

    def hexdigest(self) -> str: ...


BLAKE3 = "blake3"
"""256-bit BLAKE3, lowercase hex (signatures)."""
SHA256 = "sha256"
"""SHA-256, lowercase hex (OCI registries)."""


def new_hasher(algorithm: str) -> Hasher:
    """A fresh hasher for ``algorithm`` (:data:`ALGORITHM`, :data:`BLAKE3` or :data:`SHA256`).
    BackendUnavailableError when BLAKE3 is asked for and the blake3 package is missing."""
    if algorithm == ALGORITHM:
        return xxhash.xxh3_128()
    if algorithm == SHA256:
        return hashlib.sha256()
    if algorithm == BLAKE3:
        try:
            import blake3
        except ImportError:  # pragma: no cover - the [sign] extra is installed in CI
            from dossier.errors import BackendUnavailableError

            raise BackendUnavailableError("signing needs the blake3 package",
                                          hint="pip install 'dossier[sign]' (cryptography and "
                                          "blake3)") from None
        return blake3.blake3()
    raise ValueError(f"unknown digest algorithm {algorithm!r}")


def feed(stream: IO[bytes], hashers: Sequence[Hasher]) -> int:
    """Read everything left in ``stream`` once, in fixed chunks, into every one of ``hashers``;
    return the number of bytes read. Memory use is one buffer of :data:`CHUNK` bytes."""
    size = 0
    # page-aligned (an anonymous mapping), not a bytearray (malloc's, 16 bytes past a page
    # boundary): the kernel's copy from the page cache into a misaligned buffer took 4x as long
    # on the 2-core test hosts (0.42 s against 0.10 s per GiB)
    view = memoryview(mmap.mmap(-1, CHUNK))
    while n := stream.readinto(view):  # type: ignore[attr-defined]
        chunk = view[:n]
        for h in hashers:
            h.update(chunk)
        size += n
    return size


def digest_stream(stream: IO[bytes]) -> tuple[str, int]:
    """xxh3-128 and size of everything left in ``stream``, read in fixed chunks."""
    h = new_hasher(ALGORITHM)
    size = feed(stream, [h])
    return h.hexdigest(), size


def digest_file(path: Path) -> tuple[str, int]:
    """xxh3-128 and size of the file at ``path``, streamed."""
    with open(path, "rb", buffering=0) as f:
        return digest_stream(f)


def canonical_json(obj: Any) -> bytes:
    """Deterministic JSON bytes: sorted keys, no whitespace, UTF-8, no NaN."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False,
                      allow_nan=False).encode("utf-8")


def digest_json(obj: Any) -> str:
    """xxh3-128 of the canonical JSON form of ``obj``."""
    return digest_bytes(canonical_json(obj))
