"""``dossier.load`` of a TensorRT bundle (a trtexec run imported): verified, then the plan
deserialized and an execution context created through the backend's loader, against the fakes
of tests/backends/test_tensorrt_backend.py seen through tests/_trt_api.Checked (every TensorRT name the
load touches must exist in the real bindings of every listed version)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import _bundles as h
import numpy as np
import pytest
from test_tensorrt_backend import DEVICE, FakeTRT, fake_backend  # noqa: F401 - a fixture
from test_trtexec_import import imported, run  # noqa: F401 - a fixture

import dossier
import dossier.backends
from dossier.backends import LoadConfig
from dossier.errors import InvalidHostError
from dossier.fingerprint import CpuInfo, Fingerprint, GpuInfo, OsInfo, PythonInfo


def _gpu_host(tmp_path: Path, *, gpu: bool = True) -> Path:
    path = tmp_path / ("gpu-host.json" if gpu else "cpu-host.json")
    path.write_text(Fingerprint(
        collected_at="now", hostname="h",
        python=PythonInfo(version="3.12.0", implementation="CPython"),
        cpu=CpuInfo(model="EPYC", cores=16), os=OsInfo(system="Linux"),
        packages={"tensorrt": "11.1.0.106"} if gpu else {},
        gpus=[GpuInfo(index=0, name="NVIDIA H200", compute_capability="9.0")] if gpu else [],
    ).model_dump_json())
    return path


def test_a_tensorrt_bundle_deserializes_into_one_context(run: Path, tmp_path: Path,  # noqa: F811
                                                         fake_backend: Any,  # noqa: F811
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    bundle = imported(run, tmp_path / "out")
    fake = FakeTRT([])
    backend = fake_backend(fake)
    real = dossier.backends.get_backend
    monkeypatch.setattr(dossier.backends, "get_backend",
                        lambda name: backend if name == "tensorrt" else real(name))
    # a host without a GPU or TensorRT: INVALID, nothing deserialized
    with pytest.raises(InvalidHostError, match="requires"):
        dossier.load(bundle, host=_gpu_host(tmp_path, gpu=False))
    assert fake.deserialized == []
    # an imported bundle's tuning host is unknown: SUBOPTIMAL at best
    with pytest.warns(dossier.serve.SuboptimalWarning, match="cannot be compared"):
        engine = dossier.load(bundle, host=_gpu_host(tmp_path))
    assert fake.deserialized == [(run / "best.plan").read_bytes()]  # the verified plan's bytes
    assert engine.backend == "tensorrt" and engine.inputs == ("x",) and engine.outputs == ("y",)
    x = np.linspace(-1, 1, 8, dtype=np.float32).reshape(2, 4)
    np.testing.assert_array_equal(engine(x=x)["y"], np.maximum(x, 0))
    engine.close()
    assert DEVICE.mem == {}  # every device buffer freed


def _loaded_host_code(bundle: Path, tmp_path: Path, fake_backend: Any,  # noqa: F811
                      monkeypatch: pytest.MonkeyPatch) -> list[bool]:
    """``engine_host_code_allowed`` as the plan of ``bundle`` was deserialized by
    ``dossier.load``."""
    fake = FakeTRT([])
    backend = fake_backend(fake)
    real = dossier.backends.get_backend
    monkeypatch.setattr(dossier.backends, "get_backend",
                        lambda name: backend if name == "tensorrt" else real(name))
    with pytest.warns(dossier.serve.SuboptimalWarning):
        dossier.load(bundle, host=_gpu_host(tmp_path)).close()
    return fake.host_code


def test_the_plan_loads_as_the_manifest_entry_records(run: Path, tmp_path: Path,  # noqa: F811
                                                      fake_backend: Any,  # noqa: F811
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """A recorded load that allows host code (a version-compatible engine's): the plan is
    deserialized with it, though the tuning header records no [builder] options; the header
    is not read (a load that read it would fail on the garbage written into it)."""
    bundle = imported(run, tmp_path / "out")

    def record(manifest: dict[str, Any]) -> None:
        manifest["engines"]["shipped"]["load"] = LoadConfig(
            call="tensorrt.Runtime(logger).deserialize_cuda_engine(ENGINE bytes)",
            options={"engine_host_code_allowed": "True"}).model_dump(mode="json")

    cache = bundle / "tuning-cache.jsonl"
    cache.write_text("not a header\n" + cache.read_text().split("\n", 1)[1])
    h.reseal(bundle, record)
    assert _loaded_host_code(bundle, tmp_path, fake_backend, monkeypatch) == [True]


def test_without_a_recorded_load_the_tuning_headers_builder_options_apply(
        run: Path, tmp_path: Path, fake_backend: Any,  # noqa: F811
        monkeypatch: pytest.MonkeyPatch) -> None:
    """No load entry (a bundle older than format 1.1, or imported from trtexec): the backend
    is configured from the tuning header's [builder] options, as before."""
    bundle = imported(run, tmp_path / "out")
    assert json.loads((bundle / "manifest.json").read_text())["engines"]["shipped"].get(
        "load") is None
    assert _loaded_host_code(bundle, tmp_path, fake_backend, monkeypatch) == [False]

    def version_compatible(record: dict[str, Any]) -> dict[str, Any]:
        if record.get("kind") == "header":
            record["spec"]["builder"] = {"version_compatible": True}
        return record

    h.rewrite_cache(bundle / "tuning-cache.jsonl", version_compatible)
    h.reseal(bundle)
    assert _loaded_host_code(bundle, tmp_path, fake_backend, monkeypatch) == [True]
