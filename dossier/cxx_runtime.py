"""How shared objects link the C++ runtime, and which compiler AOTInductor should build with.

Some hosts put a wrapper compiler first on PATH whose shared objects carry their own copies of
libstdc++ (static linking: thousands of defined ``std::`` symbols, no libstdc++ among the
NEEDED entries). A process that already has the system libstdc++ loaded (through torch) then
holds two copies of the locale machinery, and ``std::regex`` in the AOTInductor model
constructor crashes. Two fixes work: build with a compiler that links libstdc++ dynamically, or
start the loading process with the system libstdc++ preloaded. :func:`choose` picks the first
when such a compiler is found, else the second.

Nothing here imports torch; compilers are probed by building a tiny shared object, once a
process: a thread that asks while another thread probes waits for its answer (the host
fingerprint is collected in a background thread while :func:`dossier.load` goes on).
"""

from __future__ import annotations

import functools
import os
import re
import shutil
import subprocess
import tempfile
import threading
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Generic, ParamSpec, TypeVar, cast

from dossier import elf

STATIC, DYNAMIC, NONE = "static", "dynamic", "none"
"""How a shared object links libstdc++: its own copy, the system's, or not at all."""
EMBEDDED_MIN = 50
"""Defined ``std::`` symbols from which a shared object without a libstdc++ NEEDED entry is
taken to carry its own copy (a wrapper compiler's output had about 3600)."""
STD_SYMBOL = re.compile(r"^_Z(?:T[VIS])?N?K?S[tabsiod]")
"""Itanium-mangled names in namespace std (``St``) or its abbreviations (Sa, Sb, Ss, Si, So, Sd)."""
SYSTEM_COMPILERS = ("/usr/bin/g++", "/usr/bin/c++", "/usr/bin/clang++")
"""Where a compiler that links the system libstdc++ is looked for when the first one does not."""
PRELOAD_ENV = "LD_PRELOAD"
_PROBE_SOURCE = """#include <locale>
#include <sstream>
#include <string>
std::string dossier_probe(int x) { std::ostringstream s; s.imbue(std::locale()); s << x;
  return s.str(); }
"""
_MAX_MEMBER = 1 << 30
_P = ParamSpec("_P")
_R = TypeVar("_R")


class _Once(Generic[_P, _R]):
    """``functools.cache`` whose misses are computed by one thread at a time: a second thread
    asking for the same answer meanwhile waits for it instead of computing it again."""

    def __init__(self, fn: Callable[_P, _R]) -> None:
        cached = functools.cache(fn)
        self._cached, self._clear = cast("Callable[_P, _R]", cached), cached.cache_clear
        self._lock = threading.RLock()
        functools.update_wrapper(self, fn)

    def __call__(self, *args: _P.args, **kwargs: _P.kwargs) -> _R:
        with self._lock:
            return self._cached(*args, **kwargs)

    def cache_clear(self) -> None:
        """Forget the answers (tests)."""
        self._clear()


@dataclass(frozen=True)
class Linkage:
    """How one shared object links the C++ runtime."""

    libstdcxx: str
    """:data:`STATIC`, :data:`DYNAMIC` or :data:`NONE`."""
    std_symbols: int
    """Defined symbols in namespace std."""
    needed: tuple[str, ...]
    """Its DT_NEEDED entries."""


def linkage(data: bytes) -> Linkage:
    """Classify a shared object's bytes (:class:`dossier.elf.ElfError` if it is not one)."""
    needed = tuple(elf.needed(data))
    std = sum(1 for name in elf.defined_symbols(data) if STD_SYMBOL.match(name))
    if any(n.startswith(("libstdc++", "libc++.")) for n in needed):
        kind = DYNAMIC
    elif std >= EMBEDDED_MIN:
        kind = STATIC
    else:
        kind = NONE
    return Linkage(kind, std, needed)


def package_linkage(pt2: Path) -> Linkage | None:
    """The linkage of an AOTInductor package's shared objects: :data:`STATIC` if any carries its
    own libstdc++; None when the package holds no readable shared object."""
    found: list[Linkage] = []
    try:
        with zipfile.ZipFile(pt2) as z:
            for info in z.infolist():
                if not info.filename.endswith(".so") or info.file_size > _MAX_MEMBER:
                    continue
                try:
                    found.append(linkage(z.read(info)))
                except elf.ElfError:
                    continue
    except (OSError, zipfile.BadZipFile):
        return None
    if not found:
        return None
    return next((x for x in found if x.libstdcxx == STATIC), None) or \
        next((x for x in found if x.libstdcxx == DYNAMIC), found[0])


@dataclass(frozen=True)
class CompilerInfo:
    """A C++ compiler and how its shared objects link libstdc++."""

    path: str
    """Absolute path of the executable as found (not resolved through links)."""
    version: str
    """First line of ``--version``."""
    libstdcxx: str
    """How a shared object it builds links libstdc++ (:data:`STATIC`, :data:`DYNAMIC`,
    :data:`NONE`), or ``unknown`` when the probe build failed."""

    def text(self) -> str:
        """One line: version, path, linkage."""
        return f"{self.version} ({self.path}; libstdc++ {self.libstdcxx})"


def first_compiler() -> str | None:
    """The compiler inductor uses by default: ``$CXX`` or the first ``g++`` on PATH."""
    exe = os.environ.get("CXX") or "g++"
    return shutil.which(exe)


@_Once
def probe(cxx: str) -> CompilerInfo | None:
    """Version of ``cxx`` and how the shared objects it builds link libstdc++; None when it does
    not run. Builds one tiny shared object (about a second)."""
    try:
        run = subprocess.run([cxx, "--version"], capture_output=True, text=True,  # noqa: S603
                             timeout=30, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    lines = run.stdout.strip().splitlines()
    if run.returncode != 0 or not lines:
        return None
    kind = "unknown"
    with tempfile.TemporaryDirectory(prefix="dossier-cxx-") as tmp:
        src, out = Path(tmp) / "probe.cpp", Path(tmp) / "probe.so"
        src.write_text(_PROBE_SOURCE)
        try:
            subprocess.run([cxx, "-shared", "-fPIC", "-O0", str(src), "-o", str(out)],  # noqa: S603
                           capture_output=True, timeout=120, check=True)
            kind = linkage(out.read_bytes()).libstdcxx
        except (OSError, subprocess.SubprocessError, elf.ElfError):
            pass
    return CompilerInfo(path=cxx, version=lines[0].strip(), libstdcxx=kind)


@_Once
def system_libstdcxx() -> str | None:
    """Path of the system ``libstdc++.so.6`` for this machine's word size (``ldconfig -p``)."""
    ldconfig = shutil.which("ldconfig") or next(
        (p for p in ("/sbin/ldconfig", "/usr/sbin/ldconfig") if os.path.exists(p)), None)
    if not ldconfig:
        return None
    try:
        text = subprocess.run([ldconfig, "-p"], capture_output=True, text=True,  # noqa: S603
                              timeout=30, check=False).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    paths = [m.group(2) for m in re.finditer(r"libstdc\+\+\.so\.6 \(([^)]*)\) => (\S+)", text)
             if "64" in m.group(1) or "AArch64" in m.group(1)]
    return next((p for p in paths if os.path.exists(p)), None)


@dataclass(frozen=True)
class CxxPlan:
    """How AOTInductor packages are built and loaded on this host."""

    compiler: CompilerInfo | None
    """The compiler packages are built with (None: none found)."""
    override: str | None
    """Set ``cpp.cxx`` to this compiler (the first one on PATH embeds libstdc++)."""
    preload: str | None
    """The system libstdc++ to preload in processes that load a package (no compiler that
    links it dynamically was found)."""


@_Once
def choose() -> CxxPlan:
    """The compiler to build with and whether loaders need a preload (probed once a process)."""
    first = first_compiler()
    info = probe(first) if first else None
    if info is None or info.libstdcxx != STATIC:
        return CxxPlan(info, None, None)
    seen = {os.path.realpath(first or "")}
    for candidate in SYSTEM_COMPILERS:
        if not os.path.exists(candidate) or os.path.realpath(candidate) in seen:
            continue
        seen.add(os.path.realpath(candidate))
        other = probe(candidate)
        if other is not None and other.libstdcxx == DYNAMIC:
            return CxxPlan(other, candidate, None)
    return CxxPlan(info, None, system_libstdcxx())


def loader_env(pt2: Path) -> dict[str, str]:
    """Environment a process needs to load ``pt2``: the system libstdc++ preloaded when the
    package carries its own copy; empty otherwise."""
    link = package_linkage(pt2)
    if link is None or link.libstdcxx != STATIC:
        return {}
    lib = system_libstdcxx()
    if lib is None:
        return {}
    current = os.environ.get(PRELOAD_ENV, "")
    if preloaded():
        return {}
    return {PRELOAD_ENV: f"{lib}:{current}" if current else lib}


def load_hint(pt2_name: str, lib: str | None) -> str:
    """The one line that tells a user how to load a package that carries its own libstdc++."""
    return (f"{pt2_name} embeds its own libstdc++: load it in a process started with "
            f"LD_PRELOAD={lib or 'the system libstdc++.so.6'} (e.g. `LD_PRELOAD={lib or '...'} "
            "python app.py`), or rebuild with a compiler that links libstdc++ dynamically")


def preloaded() -> bool:
    """True when this process was started with the system libstdc++ preloaded."""
    entries = re.split(r"[:\s]+", os.environ.get(PRELOAD_ENV, ""))
    return any(os.path.basename(e).startswith("libstdc++.so") for e in entries if e)
