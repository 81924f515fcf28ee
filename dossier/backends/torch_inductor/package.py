"""What a built package says about itself: its AOTI metadata and an identity that does not
depend on where it was built.

Packages are not byte-reproducible (absolute temporary paths and file names derived from them
are embedded); :func:`normalized_digest` hashes a package with those removed.
"""

from __future__ import annotations

import json
import re
import zipfile
from pathlib import Path

from dossier import elf
from dossier.backends.interface import (
    EngineRuntimeError,
)
from dossier.backends.torch_inductor.build import TEMP_PREFIX
from dossier.hashing import digest_bytes, digest_json

META_PREFIX = "dossier."


def package_metadata(engine: Path) -> dict[str, str]:
    """The AOTI metadata of a package (AOTI_* keys and dossier's), read from the zip."""
    try:
        with zipfile.ZipFile(engine) as z:
            names = sorted(n for n in z.namelist() if n.endswith("_metadata.json")
                           and "data/aotinductor/" in n)
            if not names:
                raise EngineRuntimeError(f"{engine} holds no AOTInductor model metadata")
            wrapper = [n for n in names if n.endswith("wrapper_metadata.json")] or names
            data = json.loads(z.read(wrapper[0]))
    except (OSError, zipfile.BadZipFile, json.JSONDecodeError) as exc:
        raise EngineRuntimeError(f"{engine} is not a readable AOTInductor package ({exc})") from exc
    return {str(k): str(v) for k, v in data.items()}



# ------------------------------------------------------------------------------ identity
_TEMP_PATH = re.compile(rb"[^\s\x00\"'<>|;,=]*" + TEMP_PREFIX.encode() + rb"[A-Za-z0-9_]{8}")
_CODE_HASH = re.compile(rb"(?<![A-Za-z0-9])c[a-z0-9]{51}(?![A-Za-z0-9])")
_SKIP_SECTIONS = (".debug", ".nv_debug", ".note.gnu.build-id", ".gnu_debuglink")
_HOST_MACHINES = {62, 183, 3, 40}  # x86-64, AArch64, i386, ARM
_SERIALIZATION_ID = ".data/serialization_id"


def _normalize(data: bytes) -> bytes:
    return _CODE_HASH.sub(b"<hash>", _TEMP_PATH.sub(b"<tmp>", data))


def _elf_digest(data: bytes) -> str | None:
    """Digest of an ELF file's sections minus debug info and build id; None if not ELF64 LE."""
    if not elf.is_elf64le(data):
        return None
    try:
        host = elf.machine(data) in _HOST_MACHINES
        parts = []
        for sec in elf.sections(data):
            if sec.name.startswith(_SKIP_SECTIONS):
                continue
            if host and sec.name in (".symtab", ".strtab"):
                continue  # the static symbol table is not loaded; local names carry file hashes
            nobits = sec.kind == elf.SHT_NOBITS
            parts.append([sec.name, sec.kind, sec.size if nobits else None,
                          digest_bytes(_normalize(sec.body(data)))])
    except elf.ElfError:
        return None
    return digest_json(parts)


def normalized_digest(pt2: Path) -> str:
    """xxh3-128 identity of an AOTInductor package that does not depend on where it was built.

    Hashes every zip member with the archive's root folder (the package file's stem), the
    temporary build folder and the code hashes inductor derives from it replaced by placeholders,
    ``.data/serialization_id`` dropped, and, in ELF members (the model ``.so``, CUDA kernel
    binaries), debug sections, the build id and the host static symbol table left out. Two
    builds of the same route on one host give the same digest; their bytes differ.
    """
    parts = []
    try:
        with zipfile.ZipFile(pt2) as z:
            for info in z.infolist():
                if info.is_dir():
                    continue
                name = info.filename.split("/", 1)[1] if "/" in info.filename else info.filename
                data = z.read(info)
                if name == _SERIALIZATION_ID:
                    data = b""
                digest = _elf_digest(data) or digest_bytes(_normalize(data))
                parts.append([_normalize(name.encode()).decode("utf-8", "replace"), digest])
    except (OSError, zipfile.BadZipFile) as exc:
        raise EngineRuntimeError(f"{pt2} is not a readable AOTInductor package ({exc})") from exc
    return digest_json(sorted(parts))


