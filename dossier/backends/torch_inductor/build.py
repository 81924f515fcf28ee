"""How a route becomes an AOTInductor build: the plan, the inductor cache folder of one build,
the matmul precision, native errors mapped to BuildError, the C++ facts of the package."""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from dossier import cxx_runtime
from dossier.backends.interface import (
    BuildError,
)

CACHE_ENV = "DOSSIER_TORCH_CACHE_DIR"
"""When set, every build uses this inductor cache folder (kept) instead of a fresh one."""
TEMP_PREFIX = "dossier-inductor-"


@dataclass(frozen=True)
class BuildPlan:
    """What a route means for one build."""

    device: str
    dtype: str
    precision: str
    configs: dict[str, object]
    """``inductor_configs`` for ``aoti_compile_and_package`` (metadata not included)."""


def short_error(exc: BaseException, limit: int = 400) -> str:
    """One line about ``exc``: a compiler's ``error:`` line when there is one."""
    text = f"{type(exc).__name__}: {exc}"
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    errors = [ln for ln in lines if "error:" in ln and "Error:" not in ln[:30]]
    line = errors[0] if errors else (lines[0] if lines else type(exc).__name__)
    if errors and lines and lines[0] != line:
        line = f"{lines[0][:120]} ... {line}"
    return line[:limit]


NATIVE_BUILD_ERRORS = ("torch._inductor.exc.InductorError", "torch._inductor.exc.CppCompileError",
                       "torch._inductor.exc.CUDACompileError",
                       "torch._dynamo.exc.BackendCompilerFailed", "torch._dynamo.exc.UserError",
                       "AttributeError (unknown config key)", "RuntimeError", "TypeError")
"""Native errors seen from export and compile; every one (any Exception) becomes a BuildError."""


def map_build_error(exc: BaseException, stage: str) -> BuildError:
    """The BuildError for a native error raised while ``stage`` (export or compile) ran."""
    if isinstance(exc, AttributeError) and "does not exist" in str(exc):
        return BuildError(f"{stage} failed: unknown inductor config key ({exc}); this torch does "
                          "not have it")
    return BuildError(f"{stage} failed: {short_error(exc)}")


@contextlib.contextmanager
def build_cache() -> Iterator[Path]:
    """TORCHINDUCTOR_CACHE_DIR = a fresh folder (removed afterwards) or CACHE_ENV's (kept)."""
    shared = os.environ.get(CACHE_ENV)
    folder = Path(shared) if shared else Path(tempfile.mkdtemp(prefix=TEMP_PREFIX))
    folder.mkdir(parents=True, exist_ok=True)
    old = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(folder)
    clear = _clear_caches()
    clear()
    try:
        yield folder
    finally:
        clear()
        if old is None:
            os.environ.pop("TORCHINDUCTOR_CACHE_DIR", None)
        else:
            os.environ["TORCHINDUCTOR_CACHE_DIR"] = old
        if not shared:
            shutil.rmtree(folder, ignore_errors=True)


def _clear_caches() -> Callable[[], None]:
    try:
        from torch._inductor.utils import clear_caches
    except ImportError:  # older torch: nothing in memory to forget
        return lambda: None
    return clear_caches


@contextlib.contextmanager
def matmul_precision(value: str) -> Iterator[None]:
    """``torch.set_float32_matmul_precision(value)`` for the duration, restored afterwards."""
    import torch

    old = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision(value)
    try:
        yield
    finally:
        torch.set_float32_matmul_precision(old)


def cxx_facts(engine: Path, cxx: object) -> dict[str, str]:
    """Build facts about the C++ compiler and how the package links libstdc++ (with the line a
    user needs to load it when it carries its own copy)."""
    plan = cxx_runtime.choose()
    info = cxx_runtime.probe(cxx[0]) if isinstance(cxx, (tuple, list)) and cxx else plan.compiler
    facts: dict[str, str] = {}
    if info is not None:
        facts.update(cxx=info.version, cxx_path=info.path)
    link = cxx_runtime.package_linkage(engine)
    if link is not None:
        facts["libstdcxx"] = link.libstdcxx
        if link.libstdcxx == cxx_runtime.STATIC:
            facts["load_hint"] = cxx_runtime.load_hint(engine.name, cxx_runtime.system_libstdcxx())
    return facts


