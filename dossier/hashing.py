"""Content digests: xxh3-128 of files (streamed) and of canonical JSON.

This is the only module that imports xxhash. xxh3-128 detects accidental corruption (a flipped
bit, a truncated copy); it is not a cryptographic hash and does not protect against someone who
wants to forge a file with the same digest. Tamper-proofing needs a signature over cryptographic
digests of every file (``dossier sign``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, BinaryIO

import xxhash

CHUNK = 1 << 20
"""Read size for streamed hashing: memory use does not depend on the file size."""

ALGORITHM = "xxh3-128"


def digest_bytes(data: bytes) -> str:
    """xxh3-128 of ``data`` as 32 hex digits."""
    return xxhash.xxh3_128_hexdigest(data)


def digest_stream(stream: BinaryIO) -> tuple[str, int]:
    """xxh3-128 and size of everything left in ``stream``, read in fixed chunks."""
    h = xxhash.xxh3_128()
    size = 0
    buf = bytearray(CHUNK)
    view = memoryview(buf)
    while True:
        n = stream.readinto(buf)  # type: ignore[attr-defined]
        if not n:
            break
        h.update(view[:n])
        size += n
    return h.hexdigest(), size


def digest_file(path: Path) -> tuple[str, int]:
    """xxh3-128 and size of the file at ``path``, streamed."""
    with open(path, "rb") as f:
        return digest_stream(f)


def canonical_json(obj: Any) -> bytes:
    """Deterministic JSON bytes: sorted keys, no whitespace, UTF-8, no NaN."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False,
                      allow_nan=False).encode("utf-8")


def digest_json(obj: Any) -> str:
    """xxh3-128 of the canonical JSON form of ``obj``."""
    return digest_bytes(canonical_json(obj))
