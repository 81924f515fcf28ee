"""Tests for dossier.fingerprint: collection on this host, flattening, JSON round trip."""

from __future__ import annotations

import importlib.metadata
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

import pytest

from dossier import fingerprint
from dossier.errors import InputError
from dossier.fingerprint import CpuInfo, Fingerprint, GpuInfo, collect, flatten, load_fingerprint
from dossier.schema import field_docs

REPO = Path(__file__).resolve().parents[2]
X86 = platform.machine().lower() in ("x86_64", "amd64")


def _has_nvidia_gpu() -> bool:
    return Path("/dev/nvidia0").exists() or Path("/proc/driver/nvidia").exists()


def test_collect_this_host() -> None:
    fp = collect()
    assert isinstance(fp, Fingerprint)
    assert fp.fingerprint_version == 1
    assert fp.collected_at.endswith("+00:00")
    assert fp.cpu.cores == os.cpu_count()
    assert fp.os.machine == platform.machine()
    assert fp.python.version == platform.python_version()
    if X86:
        assert fp.cpu.isa_flags, "an x86 CPU reports at least sse4_2/avx"
    assert fp.cpu.isa_flags == sorted(fp.cpu.isa_flags)
    assert set(fp.cpu.isa_flags) <= fingerprint.ISA_FLAGS
    assert fp.packages["onnxruntime"] == importlib.metadata.version("onnxruntime")
    assert "dossier" in fp.packages
    assert fp.compiler is None  # only on request


@pytest.mark.skipif(_has_nvidia_gpu(), reason="this host has an NVIDIA GPU")
def test_no_gpu_here() -> None:
    assert collect().gpus == []


def test_collect_is_fast_without_gpu() -> None:
    collect(include_gpu=False)  # warm caches (package metadata, imports)
    best = min(_timed(lambda: collect(include_gpu=False)) for _ in range(3))
    assert best < 0.5


def _timed(fn: object) -> float:
    start = time.perf_counter()
    fn()  # type: ignore[operator]
    return time.perf_counter() - start


def test_collect_does_not_import_engine_libraries() -> None:
    code = ("import sys, dossier.fingerprint; dossier.fingerprint.collect(); "
            "loaded = [m for m in ('onnxruntime', 'torch', 'tensorrt') if m in sys.modules]; "
            "assert not loaded, loaded")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO),
                                                                    os.environ.get("PYTHONPATH")]))}
    run = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True,
                         text=True, timeout=60, check=False)
    assert run.returncode == 0, run.stderr


def test_json_round_trip(tmp_path: Path) -> None:
    fp = collect(include_compiler=True)
    assert Fingerprint.model_validate_json(fp.model_dump_json()) == fp
    path = tmp_path / "fingerprint.json"
    path.write_text(fp.model_dump_json(indent=2))
    assert load_fingerprint(path) == fp


def test_round_trip_with_gpu(tmp_path: Path) -> None:
    fp = collect(include_gpu=False).model_copy(update={"gpus": [_h200()]})
    path = tmp_path / "fp.json"
    path.write_text(fp.model_dump_json())
    assert load_fingerprint(path) == fp


def test_load_fingerprint_errors(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="cannot read"):
        load_fingerprint(tmp_path / "missing.json")
    bad = tmp_path / "bad.json"
    bad.write_text('{"collected_at": 3}')
    with pytest.raises(InputError, match="not a fingerprint"):
        load_fingerprint(bad)
    newer = tmp_path / "newer.json"
    data = collect(include_gpu=False).model_copy(update={"fingerprint_version": 2})
    newer.write_text(data.model_dump_json())
    with pytest.raises(InputError, match="version 2"):
        load_fingerprint(newer)


def test_models_are_strict() -> None:
    with pytest.raises(ValueError):
        CpuInfo(model="x", colour="red")  # type: ignore[call-arg]
    cpu = CpuInfo(model="x")
    with pytest.raises(ValueError):
        cpu.model = "y"  # type: ignore[misc]
    for model in (CpuInfo, GpuInfo, Fingerprint):  # every field documented (the schema's text)
        assert set(field_docs(model)) == set(model.model_fields), model


def _h200() -> GpuInfo:
    return GpuInfo(index=0, name="NVIDIA H200", uuid="GPU-0000", compute_capability="9.0",
                   memory_total_mib=143771, sm_count=132, driver_version="580.159.04",
                   cuda_driver_version="13.0", mig_mode="disabled", ecc_mode="enabled",
                   power_limit_w=700.0, max_sm_clock_mhz=1980, persistence_mode=True)


def test_flatten() -> None:
    fp = collect(include_gpu=False).model_copy(update={"gpus": [_h200()]})
    flat = flatten(fp)
    assert flat == flatten(fp)
    assert list(flat) == list(flatten(fp))
    assert flat["cpu.isa_flags"] == " ".join(fp.cpu.isa_flags)
    assert flat["cpu.model"] == fp.cpu.model
    assert flat["os.glibc"] == fp.os.glibc
    assert flat["packages.onnxruntime"] == importlib.metadata.version("onnxruntime")
    assert flat["gpu.count"] == "1"
    assert flat["gpu[0].compute_capability"] == "9.0"
    assert flat["gpu[0].name"] == "NVIDIA H200"
    assert flat["gpu[0].persistence_mode"] == "true"
    assert flat["gpu[0].power_limit_w"] == "700.0"
    assert flat["gpu[0].vbios_version"] is None
    assert flat["cuda_runtime"] is None or isinstance(flat["cuda_runtime"], str)
    packages = [k for k in flat if k.startswith("packages.")]
    assert packages == sorted(packages)
    assert all(isinstance(v, str) or v is None for v in flat.values())


def test_flatten_without_gpu() -> None:
    flat = flatten(collect(include_gpu=False))
    assert flat["gpu.count"] == "0"
    assert not any(k.startswith("gpu[") for k in flat)


def test_gpu_probe_failure_is_an_empty_list(monkeypatch: pytest.MonkeyPatch) -> None:
    class Broken:
        def __getattr__(self, name: str) -> object:
            raise RuntimeError("NVML exploded")

    monkeypatch.setitem(sys.modules, "pynvml", Broken())
    assert collect().gpus == []


def test_gpu_probe_with_fake_nvml(monkeypatch: pytest.MonkeyPatch) -> None:
    class Memory:
        total = 80 * 2**30

    class FakeNvml:
        NVML_CLOCK_SM, NVML_CLOCK_MEM = 1, 2

        def __getattr__(self, name: str) -> object:  # every other query is unsupported
            def unsupported(*args: object) -> object:
                raise RuntimeError(f"{name}: not supported")

            return unsupported

        nvmlInit = nvmlShutdown = staticmethod(lambda: None)
        nvmlSystemGetDriverVersion = staticmethod(lambda: "550.90.07")
        nvmlSystemGetCudaDriverVersion = staticmethod(lambda: 12040)
        nvmlDeviceGetCount = staticmethod(lambda: 1)
        nvmlDeviceGetHandleByIndex = staticmethod(lambda i: f"h{i}")
        nvmlDeviceGetName = staticmethod(lambda h: b"NVIDIA A100-SXM4-80GB")
        nvmlDeviceGetCudaComputeCapability = staticmethod(lambda h: (8, 0))
        nvmlDeviceGetMemoryInfo = staticmethod(lambda h: Memory())
        nvmlDeviceGetNumGpuCores = staticmethod(lambda h: 6912)
        nvmlDeviceGetMigMode = staticmethod(lambda h: [1, 1])
        nvmlDeviceGetEnforcedPowerLimit = staticmethod(lambda h: 400000)
        nvmlDeviceGetMaxClockInfo = staticmethod(lambda h, c: 1410 if c == 1 else 1593)

    monkeypatch.setitem(sys.modules, "pynvml", FakeNvml())
    (gpu,) = collect().gpus
    assert gpu == GpuInfo(index=0, name="NVIDIA A100-SXM4-80GB", compute_capability="8.0",
                          memory_total_mib=81920, sm_count=108, driver_version="550.90.07",
                          cuda_driver_version="12.4", mig_mode="enabled", power_limit_w=400.0,
                          max_sm_clock_mhz=1410, max_mem_clock_mhz=1593)


def test_matrix_units_are_the_cpus_own_amx_bf16_and_vnni_flags(monkeypatch: pytest.MonkeyPatch) -> None:
    cpu = fingerprint.CpuInfo(model="m", vendor="GenuineIntel",
                              isa_flags=["amx_int8", "avx2", "avx512_bf16", "avx512_vnni", "fma"])
    monkeypatch.setattr(fingerprint, "collect_cpu", lambda: cpu)
    assert fingerprint.matrix_units() == {
        "model": "m", "vendor": "GenuineIntel",
        "matrix_flags": ["amx_int8", "avx512_bf16", "avx512_vnni"]}
