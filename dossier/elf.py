"""A small reader for 64-bit little-endian ELF shared objects: sections, needed libraries and
defined symbols. Enough to tell how a shared object links the C++ runtime; nothing is executed.

Input is untrusted (a member of an engine package read from a bundle): every offset is checked
against the data, and anything malformed gives :class:`ElfError`.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

SHT_SYMTAB, SHT_STRTAB, SHT_DYNAMIC, SHT_NOBITS, SHT_DYNSYM = 2, 3, 6, 8, 11
DT_NEEDED = 1
_SYM = struct.Struct("<IBBHQQ")
_DYN = struct.Struct("<qQ")


class ElfError(ValueError):
    """Not a 64-bit little-endian ELF file, or a malformed one."""


@dataclass(frozen=True)
class Section:
    """One section header."""

    name: str
    kind: int
    offset: int
    size: int
    link: int
    entsize: int

    def body(self, data: bytes) -> bytes:
        """The section's bytes (empty for SHT_NOBITS)."""
        if self.kind == SHT_NOBITS:
            return b""
        if self.offset + self.size > len(data):
            raise ElfError(f"section {self.name} lies past the end of the file")
        return data[self.offset:self.offset + self.size]


def is_elf64le(data: bytes) -> bool:
    """True when ``data`` starts like a 64-bit little-endian ELF file."""
    return data[:4] == b"\x7fELF" and len(data) > 0x40 and data[4] == 2 and data[5] == 1


def machine(data: bytes) -> int:
    """The ELF e_machine field (62: x86-64, 183: AArch64)."""
    value: int = struct.unpack_from("<H", data, 0x12)[0]
    return value


def sections(data: bytes) -> list[Section]:
    """Every section header, named."""
    if not is_elf64le(data):
        raise ElfError("not a 64-bit little-endian ELF file")
    try:
        shoff, = struct.unpack_from("<Q", data, 0x28)
        shentsize, shnum, shstrndx = struct.unpack_from("<HHH", data, 0x3A)
        raw = [struct.unpack_from("<IIQQQQIIQQ", data, shoff + i * shentsize)
               for i in range(shnum)]
    except struct.error as exc:
        raise ElfError(f"truncated section headers ({exc})") from None
    if shstrndx >= len(raw):
        raise ElfError("no section name table")
    names = Section("", raw[shstrndx][1], raw[shstrndx][4], raw[shstrndx][5], 0, 0).body(data)
    out = []
    for name_at, kind, _flags, _addr, off, size, link, _info, _align, entsize in raw:
        end = names.find(b"\x00", name_at)
        name = names[name_at:end if end >= 0 else None].decode("ascii", "replace")
        out.append(Section(name, kind, off, size, link, entsize))
    return out


def _string(table: bytes, at: int) -> str:
    end = table.find(b"\x00", at)
    return table[at:end if end >= 0 else None].decode("utf-8", "replace")


def needed(data: bytes) -> list[str]:
    """The DT_NEEDED entries of the dynamic section, in order."""
    secs = sections(data)
    out: list[str] = []
    for sec in secs:
        if sec.kind != SHT_DYNAMIC or sec.link >= len(secs):
            continue
        strings = secs[sec.link].body(data)
        body = sec.body(data)
        for i in range(len(body) // _DYN.size):
            tag, value = _DYN.unpack_from(body, i * _DYN.size)
            if tag == 0:
                break
            if tag == DT_NEEDED:
                out.append(_string(strings, value))
    return out


def defined_symbols(data: bytes) -> list[str]:
    """Names of the symbols the file defines (section index not UNDEF), from the static symbol
    table when there is one (it holds the hidden ones too), else from the dynamic one."""
    secs = sections(data)
    tables = [s for s in secs if s.kind == SHT_SYMTAB] or [s for s in secs if s.kind == SHT_DYNSYM]
    out = []
    for sec in tables:
        if sec.link >= len(secs):
            raise ElfError(f"symbol table {sec.name} links to no string table")
        strings = secs[sec.link].body(data)
        body = sec.body(data)
        for i in range(len(body) // _SYM.size):
            name_at, _info, _other, shndx, _value, _size = _SYM.unpack_from(body, i * _SYM.size)
            if shndx != 0 and name_at:
                out.append(_string(strings, name_at))
    return out
