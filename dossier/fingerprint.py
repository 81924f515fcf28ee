"""Host fingerprints: what a tuned engine may depend on, collected fast and without side effects.

:func:`collect` reads the CPU, OS, installed package versions and (through NVML) the GPUs of this
host. It never imports torch, tensorrt or onnxruntime: package versions come from
:mod:`importlib.metadata`. A fact that cannot be read is ``None``; collecting never raises.
:func:`flatten` turns a fingerprint into ``field path -> string`` pairs that
:mod:`dossier.host.policy` compares.
"""

from __future__ import annotations

import importlib.metadata
import os
import platform
import sys
from collections.abc import Callable, Iterator, Mapping
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel, ConfigDict, ValidationError

from dossier.errors import InputError
from dossier.files import read_small

FINGERPRINT_VERSION = 1
"""The only ``fingerprint_version`` this reader knows."""

ISA_FLAGS = frozenset({
    "sse4_1", "sse4_2", "avx", "avx2", "fma", "f16c", "avx_vnni", "avx512f", "avx512bw",
    "avx512vl", "avx512dq", "avx512cd", "avx512_vnni", "avx512vnni", "avx512_bf16",
    "avx512_fp16", "amx_tile", "amx_bf16", "amx_int8", "amx_fp16",
    # AArch64 / ARM ``Features``
    "neon", "asimd", "asimdhp", "asimddp", "asimdfhm", "fphp", "sve", "sve2", "i8mm", "bf16",
    "sme",
})
"""CPU flags that decide which kernels an engine may contain; other flags are not recorded."""

_CUDA_SUFFIXES = ("-cu13", "-cu12", "-cu11", "")
PACKAGES = (
    "dossier", "onnxruntime", "onnxruntime-gpu", "onnxruntime-openvino",
    "onnxruntime-ep-openvino", "onnx", "numpy", "pyarrow", "torch", "triton",
    "tensorrt", "tensorrt-cu12", "tensorrt-cu12-libs", "tensorrt-cu13", "tensorrt-cu13-libs",
    "cuda-python", "cuda-bindings", "nvidia-ml-py",
    *(f"nvidia-{lib}{s}" for lib in ("cuda-runtime", "cudnn", "cublas", "cuda-nvrtc")
      for s in _CUDA_SUFFIXES),
)
"""Distributions whose installed versions are recorded (when installed)."""
IMPORTED = ("torch",)
"""Modules that :func:`collect` reads a fact from when they are imported already (torch's CUDA
runtime version), never importing them."""

_T = TypeVar("_T")


class _Model(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class CpuInfo(_Model):
    """The host CPU."""

    model: str | None = None
    """Marketing name, e.g. "AMD EPYC 9654 96-Core Processor"."""
    vendor: str | None = None
    """Vendor id ("GenuineIntel", "AuthenticAMD") or the ARM implementer code."""
    isa_flags: list[str] = []
    """Sorted instruction-set flags among :data:`ISA_FLAGS` that this CPU reports."""
    cores: int | None = None
    """Logical CPUs (hardware threads)."""
    physical_cores: int | None = None
    """Physical cores, when /proc/cpuinfo tells them apart."""


class OsInfo(_Model):
    """The operating system."""

    system: str | None = None
    """"Linux", "Windows", "Darwin"."""
    release: str | None = None
    """Kernel release, e.g. "6.8.0-45-generic"."""
    glibc: str | None = None
    """GNU C library version, e.g. "2.35"; None on other C libraries."""
    distribution: str | None = None
    """PRETTY_NAME from /etc/os-release, e.g. "Ubuntu 22.04.4 LTS"."""
    machine: str | None = None
    """Machine architecture, e.g. "x86_64", "aarch64"."""


class PythonInfo(_Model):
    """The Python interpreter."""

    version: str
    """Full version, e.g. "3.11.7"."""
    implementation: str
    """"CPython", "PyPy"."""


class GpuInfo(_Model):
    """One NVIDIA GPU as NVML reports it."""

    index: int
    """NVML index (PCI bus order; CUDA's order may differ unless CUDA_DEVICE_ORDER=PCI_BUS_ID)."""
    name: str | None = None
    """Product name, e.g. "NVIDIA H200"."""
    uuid: str | None = None
    """Unique id of this very board ("GPU-..."); identifies, never decides."""
    compute_capability: str | None = None
    """CUDA compute capability, e.g. "9.0"."""
    memory_total_mib: int | None = None
    """Total device memory in MiB."""
    sm_count: int | None = None
    """Streaming multiprocessors (NVML's CUDA core count over the cores per SM of the arch)."""
    driver_version: str | None = None
    """Kernel driver version, e.g. "550.90.07"."""
    cuda_driver_version: str | None = None
    """Highest CUDA version the driver supports, e.g. "12.4"."""
    vbios_version: str | None = None
    """Video BIOS version."""
    mig_mode: str | None = None
    """Multi-Instance GPU mode: "enabled" or "disabled"."""
    ecc_mode: str | None = None
    """ECC memory mode: "enabled" or "disabled"."""
    power_limit_w: float | None = None
    """Enforced power limit in watts."""
    max_sm_clock_mhz: int | None = None
    """Maximum SM clock in MHz."""
    max_mem_clock_mhz: int | None = None
    """Maximum memory clock in MHz."""
    app_sm_clock_mhz: int | None = None
    """Application SM clock in MHz (what kernels run at when not boosting)."""
    app_mem_clock_mhz: int | None = None
    """Application memory clock in MHz."""
    persistence_mode: bool | None = None
    """Whether the driver stays loaded with no client (persistence mode)."""


class Fingerprint(_Model):
    """Everything about a host that a tuned engine may depend on."""

    fingerprint_version: int = FINGERPRINT_VERSION
    """Format version of this record."""
    collected_at: str
    """When it was collected: UTC, ISO 8601."""
    hostname: str | None = None
    """Host name; recorded, never decides."""
    python: PythonInfo
    """The interpreter that collected it."""
    cpu: CpuInfo
    """The CPU."""
    os: OsInfo
    """The operating system."""
    packages: dict[str, str] = {}
    """Installed versions of the relevant distributions (see :data:`PACKAGES`), by name."""
    cuda_runtime: str | None = None
    """CUDA runtime version (from the nvidia-cuda-runtime wheel, or an already imported torch)."""
    cudnn: str | None = None
    """cuDNN version (from the nvidia-cudnn wheel)."""
    gpus: list[GpuInfo] = []
    """NVIDIA GPUs in NVML index order; empty without NVML, driver or GPU."""
    compiler: str | None = None
    """First line of the C++ compiler's ``--version`` (collected only on request): the compiler
    AOTInductor builds with (the first on PATH, or the system one that dossier picks when the
    first embeds libstdc++)."""
    compiler_path: str | None = None
    """Path of that compiler."""
    compiler_libstdcxx: str | None = None
    """How the shared objects it builds link libstdc++: "dynamic", "static" (their own copy: a
    process must preload the system libstdc++ to load them) or "none"."""
    trt_internal_options: str | None = None
    """``TRT_INTERNAL_OPTIONS`` as set when collected: TensorRT's internal switches (its
    ``bypass_build_route_whitelist`` makes TensorRT accept build-route knobs that
    ``all_build_routes`` does not list). None when unset. Engines are built in child processes
    that inherit it; each TensorRT engine also records it."""


def collect(*, include_gpu: bool = True, include_compiler: bool = False,
            imported: Mapping[str, object] | None = None) -> Fingerprint:
    """Fingerprint this host. Never raises for a missing fact; never imports an engine library.

    Args:
        include_gpu: query NVML for GPUs (``pynvml`` from nvidia-ml-py, imported lazily).
        include_compiler: run the C++ compiler's ``--version`` (AOTInductor compiles with it).
        imported: the modules of :data:`IMPORTED` taken as imported (default: those in
            ``sys.modules`` now). A collection that runs in another thread is given the
            caller's as they were when it started, so that what it records does not depend on
            what the caller imports meanwhile (:func:`dossier.load` imports torch while the
            fingerprint is collected).
    """
    if imported is None:
        imported = imported_now()
    packages = _packages()
    return Fingerprint(
        collected_at=datetime.now(timezone.utc).isoformat(timespec="seconds"),
        hostname=platform.node() or None,
        python=PythonInfo(version=platform.python_version(),
                          implementation=platform.python_implementation()),
        cpu=collect_cpu(),
        os=_os(),
        packages=packages,
        cuda_runtime=_first(packages, "nvidia-cuda-runtime") or _torch_cuda(imported),
        cudnn=_first(packages, "nvidia-cudnn"),
        gpus=_gpus() if include_gpu else [],
        **(_compiler() if include_compiler else {}),
        trt_internal_options=os.environ.get("TRT_INTERNAL_OPTIONS"),
    )


def imported_now() -> dict[str, object]:
    """The modules of :data:`IMPORTED` that this process has imported (``collect``'s
    ``imported``)."""
    return {name: sys.modules[name] for name in IMPORTED if sys.modules.get(name) is not None}


def flatten(fp: Fingerprint) -> dict[str, str | None]:
    """Field paths to string values, in a fixed order.

    Nested models give dotted paths ("cpu.model"), packages give "packages.NAME" (sorted), lists of
    flags are space-joined, booleans are "true"/"false", and each GPU gives "gpu[I].FIELD" after
    "gpu.count".
    """
    out: dict[str, str | None] = {}
    for name in type(fp).model_fields:
        value = getattr(fp, name)
        if name == "gpus":
            out["gpu.count"] = str(len(value))
            for gpu in value:
                out.update(_walk(gpu, f"gpu[{gpu.index}]"))
        elif name == "packages":
            out.update((f"packages.{k}", v) for k, v in sorted(value.items()))
        else:
            out.update(_walk(value, name))
    return out


FINGERPRINT_MAX_BYTES = 16 << 20
"""Largest fingerprint file read (a real one is a few KiB)."""


def load_fingerprint(path: str | os.PathLike[str]) -> Fingerprint:
    """Read a fingerprint JSON file; :class:`InputError` if unreadable, malformed or too new."""
    p = Path(path)
    try:
        fp = Fingerprint.model_validate_json(read_small(p, FINGERPRINT_MAX_BYTES))
    except OSError as exc:
        raise InputError(f"{p}: cannot read fingerprint: {exc.strerror or exc}") from exc
    except ValidationError as exc:
        first = exc.errors()[0]
        loc = ".".join(str(x) for x in first["loc"]) or "(top level)"
        raise InputError(f"{p}: not a fingerprint: {loc}: {first['msg']}") from exc
    if fp.fingerprint_version != FINGERPRINT_VERSION:
        raise InputError(f"{p}: fingerprint version {fp.fingerprint_version} is not known to "
                         f"this dossier (it reads version {FINGERPRINT_VERSION})",
                         hint="upgrade dossier on this host")
    return fp


def _walk(value: Any, prefix: str) -> Iterator[tuple[str, str | None]]:
    if isinstance(value, BaseModel):
        for name in type(value).model_fields:
            yield from _walk(getattr(value, name), f"{prefix}.{name}")
    elif value is None:
        yield prefix, None
    elif isinstance(value, bool):
        yield prefix, "true" if value else "false"
    elif isinstance(value, list):
        yield prefix, " ".join(str(v) for v in value)
    else:
        yield prefix, str(value)


def _call(fn: Callable[..., _T], *args: Any) -> _T | None:
    try:
        return fn(*args)
    except Exception:  # any failure of an optional probe means "unknown"
        return None


def _cpuinfo() -> list[dict[str, str]]:
    """/proc/cpuinfo as one dict per processor block (lower-case keys); [] where there is none."""
    try:
        text = Path("/proc/cpuinfo").read_text(errors="replace")
    except OSError:
        return []
    blocks = [(line.partition(":") for line in b.splitlines()) for b in text.split("\n\n")]
    return [d for d in ({k.strip().lower(): v.strip() for k, sep, v in b if sep} for b in blocks)
            if d]


def matrix_units() -> dict[str, object]:
    """This host's CPU with the flags of its matrix and low-precision dot-product units (AMX,
    AVX-512 BF16 and VNNI), where int8 and bf16 kernels run: what a precision figure depends
    on (recorded beside the benchmarks' results)."""
    cpu = collect_cpu()
    return {"model": cpu.model, "vendor": cpu.vendor,
            "matrix_flags": [f for f in cpu.isa_flags
                             if f.startswith(("amx", "avx512_bf16", "avx512_vnni"))]}


def collect_cpu() -> CpuInfo:
    """This host's CPU: model, vendor, instruction-set flags, cores."""
    blocks = _cpuinfo()
    first = blocks[0] if blocks else {}
    flags = (first.get("flags") or first.get("features") or "").split()
    cores = {(b.get("physical id"), b["core id"]) for b in blocks if "core id" in b}
    model = first.get("model name") or first.get("hardware") or _call(platform.processor)
    return CpuInfo(
        model=model or None,
        vendor=first.get("vendor_id") or first.get("cpu implementer"),
        isa_flags=sorted(ISA_FLAGS.intersection(flags)),
        cores=os.cpu_count(),
        physical_cores=len(cores) or None,
    )


def _os() -> OsInfo:
    glibc = _call(os.confstr, "CS_GNU_LIBC_VERSION")  # "glibc 2.35"
    if glibc and glibc.startswith("glibc "):
        glibc = glibc.split()[1]
    else:
        lib, version = _call(platform.libc_ver) or ("", "")
        glibc = version if lib == "glibc" and version else None
    return OsInfo(system=platform.system() or None, release=platform.release() or None,
                  glibc=glibc, distribution=_os_release(), machine=platform.machine() or None)


def _os_release() -> str | None:
    for candidate in ("/etc/os-release", "/usr/lib/os-release"):
        try:
            lines = Path(candidate).read_text(errors="replace").splitlines()
        except OSError:
            continue
        for line in lines:
            if line.startswith("PRETTY_NAME="):
                return line.partition("=")[2].strip().strip("\"'") or None
    return None


def _packages() -> dict[str, str]:
    found = {name: v for name in PACKAGES if (v := _call(importlib.metadata.version, name))}
    if "dossier" not in found:  # running from a source tree
        from dossier.version import __version__

        found["dossier"] = __version__
    return found


def _first(packages: dict[str, str], stem: str) -> str | None:
    return next((packages[stem + s] for s in _CUDA_SUFFIXES if stem + s in packages), None)


def _torch_cuda(imported: Mapping[str, object]) -> str | None:
    torch = imported.get("torch")  # only if the caller imported it already; never import it
    version = getattr(getattr(torch, "version", None), "cuda", None)
    return str(version) if version else None


def _compiler() -> dict[str, str | None]:
    from dossier.cxx_runtime import choose

    info = _call(choose)
    c = info.compiler if info is not None else None
    if c is None:
        return {}
    return {"compiler": c.version, "compiler_path": c.path, "compiler_libstdcxx": c.libstdcxx}


def _gpus() -> list[GpuInfo]:
    try:
        pynvml = importlib.import_module("pynvml")  # nvidia-ml-py; optional, untyped
        pynvml.nvmlInit()
    except Exception:  # no library, no driver, no GPU
        return []
    try:
        driver = _text(_call(pynvml.nvmlSystemGetDriverVersion))
        cuda = _call(pynvml.nvmlSystemGetCudaDriverVersion)
        cuda_str = f"{cuda // 1000}.{cuda % 1000 // 10}" if isinstance(cuda, int) else None
        return [_gpu(pynvml, i, driver, cuda_str) for i in range(pynvml.nvmlDeviceGetCount())]
    except Exception:
        return []
    finally:
        _call(pynvml.nvmlShutdown)


def _gpu(nv: Any, index: int, driver: str | None, cuda: str | None) -> GpuInfo:
    h = nv.nvmlDeviceGetHandleByIndex(index)
    cc = _call(nv.nvmlDeviceGetCudaComputeCapability, h)
    mem = _call(nv.nvmlDeviceGetMemoryInfo, h)
    attrs = _call(nv.nvmlDeviceGetAttributes, h)  # MIG handles only, on current drivers
    sm_count = getattr(attrs, "multiprocessorCount", None) or _sm_count(
        _call(nv.nvmlDeviceGetNumGpuCores, h), cc)
    power = _call(nv.nvmlDeviceGetEnforcedPowerLimit, h)
    persistence = _call(nv.nvmlDeviceGetPersistenceMode, h)
    return GpuInfo(
        index=index,
        name=_text(_call(nv.nvmlDeviceGetName, h)),
        uuid=_text(_call(nv.nvmlDeviceGetUUID, h)),
        compute_capability=f"{cc[0]}.{cc[1]}" if cc else None,
        memory_total_mib=int(mem.total) // 2**20 if mem is not None else None,
        sm_count=sm_count,
        driver_version=driver,
        cuda_driver_version=cuda,
        vbios_version=_text(_call(nv.nvmlDeviceGetVbiosVersion, h)),
        mig_mode=_mode(_call(nv.nvmlDeviceGetMigMode, h)),
        ecc_mode=_mode(_call(nv.nvmlDeviceGetEccMode, h)),
        power_limit_w=power / 1000 if isinstance(power, int) else None,
        max_sm_clock_mhz=_call(nv.nvmlDeviceGetMaxClockInfo, h, nv.NVML_CLOCK_SM),
        max_mem_clock_mhz=_call(nv.nvmlDeviceGetMaxClockInfo, h, nv.NVML_CLOCK_MEM),
        app_sm_clock_mhz=_call(nv.nvmlDeviceGetApplicationsClock, h, nv.NVML_CLOCK_SM),
        app_mem_clock_mhz=_call(nv.nvmlDeviceGetApplicationsClock, h, nv.NVML_CLOCK_MEM),
        persistence_mode=bool(persistence) if isinstance(persistence, int) else None,
    )


_CORES_PER_SM = {(6, 0): 64, (7, 0): 64, (7, 2): 64, (7, 5): 64, (8, 0): 64}
"""CUDA cores per SM where not 128, from Pascal on (CUDA samples' _ConvertSMVer2Cores)."""


def _sm_count(cores: Any, cc: Any) -> int | None:
    if not isinstance(cores, int) or not cores or not cc or tuple(cc) < (6, 0):
        return None
    per_sm = _CORES_PER_SM.get((cc[0], cc[1]), 128)
    return cores // per_sm if cores % per_sm == 0 else None


def _text(value: Any) -> str | None:
    if isinstance(value, bytes):
        value = value.decode(errors="replace")
    return value.strip() or None if isinstance(value, str) else None


def _mode(value: Any) -> str | None:
    """NVML (current, pending) mode pair -> "enabled"/"disabled"."""
    if isinstance(value, (tuple, list)) and value and isinstance(value[0], int):
        return "enabled" if value[0] else "disabled"
    return None
