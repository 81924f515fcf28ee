"""The header of a TensorRT plan file, read without TensorRT (``verify`` and ``explain`` of a
bundle, the trtexec import)."""

from __future__ import annotations

import struct
from pathlib import Path

from pydantic import BaseModel, ConfigDict

from dossier.errors import BundleFormatError


class PlanHeaderError(BundleFormatError):
    """Bytes that are not a TensorRT plan, or a plan header of a layout this reader does not know."""


# --------------------------------------------------------------------------------------------
# Plan header

PLAN_TAG = 0x74727466
"""u32 little-endian at byte 0 of every TensorRT plan (b"ftrt")."""
KNOWN_SERIALIZATION_VERSIONS = (0,)
"""Serialization versions (u32 at byte 4) whose header layout is known; trtexec handles only 0."""
_HEADER_SIZE = 28


class PlanHeader(BaseModel):
    """The fields of a TensorRT plan's header that can be read without deserializing it."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    tag: int
    """u32 at byte 0; always 0x74727466."""
    serialization_version: int
    """u32 at byte 4."""
    trt_version: tuple[int, int, int, int]
    """Bytes 24..27: major, minor, patch, build of the TensorRT that built the plan."""

    @property
    def trt_version_text(self) -> str:
        """``major.minor.patch.build``, as ``trtexec --getPlanVersionOnly`` reports it."""
        return ".".join(str(v) for v in self.trt_version)

    def facts(self) -> dict[str, str]:
        """The header as engine facts."""
        return {"plan_tag": f"0x{self.tag:08x}",
                "plan_serialization_version": str(self.serialization_version),
                "plan_trt_version": self.trt_version_text}


def parse_plan_header(data: bytes) -> PlanHeader:
    """Read a plan's header (the first 28 bytes are enough).

    Layout: u32 little-endian tag 0x74727466 at byte 0, u32 serialization version at byte 4,
    TensorRT major, minor, patch, build as one byte each at bytes 24..27.

    Raises PlanHeaderError when ``data`` is shorter than 28 bytes, does not start with the tag,
    or has a serialization version whose layout is not known.
    """
    data = bytes(data[:_HEADER_SIZE])
    if len(data) < 8 or struct.unpack_from("<I", data, 0)[0] != PLAN_TAG:
        if len(data) >= 4:
            tag = f"0x{struct.unpack_from('<I', data, 0)[0]:08x}"
            raise PlanHeaderError(f"not a TensorRT plan (tag {tag}, expected 0x{PLAN_TAG:08x})")
        raise PlanHeaderError(f"not a TensorRT plan ({len(data)} bytes; a plan header has "
                              f"{_HEADER_SIZE})")
    if len(data) < _HEADER_SIZE:
        raise PlanHeaderError(f"truncated TensorRT plan ({len(data)} bytes; the header has "
                              f"{_HEADER_SIZE})")
    version = struct.unpack_from("<I", data, 4)[0]
    if version not in KNOWN_SERIALIZATION_VERSIONS:
        raise PlanHeaderError(
            f"TensorRT plan with serialization version {version}; this reader knows "
            f"{', '.join(map(str, KNOWN_SERIALIZATION_VERSIONS))}",
            hint="a newer dossier may read it; `trtexec --loadEngine=PLAN --getPlanVersionOnly` "
                 "prints its TensorRT version")
    major, minor, patch, build = data[24:28]
    return PlanHeader(tag=PLAN_TAG, serialization_version=version,
                      trt_version=(major, minor, patch, build))


def read_plan_header(path: Path) -> PlanHeader:
    """:func:`parse_plan_header` of the file at ``path``; PlanHeaderError if unreadable."""
    try:
        with open(path, "rb") as f:
            data = f.read(_HEADER_SIZE)
    except OSError as exc:
        raise PlanHeaderError(f"cannot read plan {path}: {exc.strerror or exc}") from None
    return parse_plan_header(data)


