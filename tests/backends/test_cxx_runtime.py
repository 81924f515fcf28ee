"""How shared objects link libstdc++, and the compiler choice for AOTInductor packages."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import threading
import time
import zipfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from dossier import cxx_runtime, elf

GXX = shutil.which("g++")
pytestmark = pytest.mark.skipif(GXX is None or not sys.platform.startswith("linux"),
                                reason="needs g++ on Linux")
SOURCE = """#include <regex>
#include <string>
bool match(const std::string& s) { return std::regex_match(s, std::regex("[a-z]+")); }
"""


def _shared_object(tmp: Path, name: str, *flags: str) -> Path:
    src = tmp / "probe.cpp"
    src.write_text(SOURCE)
    out = tmp / name
    subprocess.run([GXX, "-shared", "-fPIC", "-O0", *flags, str(src), "-o", str(out)],  # type: ignore[list-item]
                   check=True, capture_output=True, timeout=300)
    return out


@pytest.fixture(scope="module")
def objects(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    tmp = tmp_path_factory.mktemp("cxx")
    return {"dynamic": _shared_object(tmp, "dynamic.so"),
            "static": _shared_object(tmp, "static.so", "-static-libstdc++")}


def test_linkage_tells_an_embedded_libstdcxx_from_the_system_one(objects) -> None:  # type: ignore[no-untyped-def]
    dyn = cxx_runtime.linkage(objects["dynamic"].read_bytes())
    static = cxx_runtime.linkage(objects["static"].read_bytes())
    assert dyn.libstdcxx == cxx_runtime.DYNAMIC and any(n.startswith("libstdc++") for n in dyn.needed)
    assert static.libstdcxx == cxx_runtime.STATIC
    assert not any(n.startswith("libstdc++") for n in static.needed)
    # the static copy carries the locale machinery that crashed std::regex on the H200 host
    assert static.std_symbols > cxx_runtime.EMBEDDED_MIN and static.std_symbols > dyn.std_symbols
    nm = subprocess.run(["nm", "-C", str(objects["static"])], capture_output=True, text=True,  # noqa: S607
                        check=False).stdout if shutil.which("nm") else ""
    if nm:  # an independent count: nm's demangled std:: definitions
        defined = sum(1 for ln in nm.splitlines() if " std::" in ln and " U " not in ln)
        assert static.std_symbols >= defined * 0.5


def test_a_package_that_embeds_libstdcxx_needs_the_preload(objects, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    for kind, so in objects.items():
        pt2 = tmp_path / f"{kind}.pt2"
        with zipfile.ZipFile(pt2, "w") as z:
            z.writestr("m/data/aotinductor/model/m.wrapper.so", so.read_bytes())
            z.writestr("m/data/aotinductor/model/m_metadata.json", "{}")
        assert cxx_runtime.package_linkage(pt2).libstdcxx == kind  # type: ignore[union-attr]
        env = cxx_runtime.loader_env(pt2)
        lib = cxx_runtime.system_libstdcxx()
        if kind == "static" and lib and not cxx_runtime.preloaded():
            assert env == {"LD_PRELOAD": lib} or env["LD_PRELOAD"].startswith(lib + ":")
        else:
            assert env == {}
    assert "LD_PRELOAD=" in cxx_runtime.load_hint("model.pt2", "/lib/libstdc++.so.6")


def test_a_wrapper_compiler_that_embeds_libstdcxx_is_replaced_by_the_system_one(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    wrapper = tmp_path / "bin" / "g++"
    wrapper.parent.mkdir()
    wrapper.write_text(f'#!/bin/sh\nexec {GXX} -static-libstdc++ "$@"\n')
    wrapper.chmod(0o755)
    monkeypatch.setenv("PATH", f"{wrapper.parent}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.delenv("CXX", raising=False)
    monkeypatch.setattr(cxx_runtime, "SYSTEM_COMPILERS", (GXX,))
    cxx_runtime.choose.cache_clear()
    try:
        plan = cxx_runtime.choose()
        assert cxx_runtime.first_compiler() == str(wrapper)
        assert cxx_runtime.probe(str(wrapper)).libstdcxx == cxx_runtime.STATIC  # type: ignore[union-attr]
        assert plan.override == GXX and plan.preload is None
        assert plan.compiler is not None and plan.compiler.libstdcxx == cxx_runtime.DYNAMIC
        # no system compiler that links dynamically: the loaders preload the system library
        monkeypatch.setattr(cxx_runtime, "SYSTEM_COMPILERS", ())
        cxx_runtime.choose.cache_clear()
        plan = cxx_runtime.choose()
        assert plan.override is None and plan.preload == cxx_runtime.system_libstdcxx()
    finally:
        cxx_runtime.choose.cache_clear()


def test_a_thread_asking_while_another_probes_waits_for_its_answer(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The host fingerprint is collected in a background thread while the loading thread goes
    on: a second thread that asks for the plan meanwhile waits for the first one's probe
    rather than building the probe's shared object a second time at once."""
    calls: list[str] = []
    release = threading.Event()

    def slow_probe(cxx: str) -> cxx_runtime.CompilerInfo:
        calls.append(cxx)
        release.wait(10)
        return cxx_runtime.CompilerInfo(cxx, "g++ 12", cxx_runtime.DYNAMIC)

    monkeypatch.setattr(cxx_runtime, "probe", slow_probe)
    monkeypatch.setattr(cxx_runtime, "first_compiler", lambda: "/opt/bin/g++")
    cxx_runtime.choose.cache_clear()
    try:
        with ThreadPoolExecutor(2) as pool:
            first = pool.submit(cxx_runtime.choose)
            deadline = time.monotonic() + 10
            while not calls and time.monotonic() < deadline:
                time.sleep(0.01)
            second = pool.submit(cxx_runtime.choose)
            time.sleep(0.2)
            assert calls == ["/opt/bin/g++"] and not second.done()  # waiting, not probing
            release.set()
            assert first.result(10) is second.result(10)
        assert calls == ["/opt/bin/g++"]
    finally:
        release.set()
        cxx_runtime.choose.cache_clear()


def test_elf_reader_refuses_what_is_not_elf() -> None:
    with pytest.raises(elf.ElfError):
        elf.needed(b"not an elf file at all, just text" * 4)
    with pytest.raises(elf.ElfError):
        elf.sections(b"\x7fELF\x02\x01" + b"\x00" * 100)  # headers point nowhere
