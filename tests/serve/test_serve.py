"""``dossier.load``: verify, then load the engine as it was timed; ``dossier run``.

The golden convnet bundle (ONNX Runtime) is judged against its own tuning host's fingerprint
(``host=``), so its verdict is VALID here whatever this CPU is; edited copies of that
fingerprint stand for other hosts."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import threading
import warnings
from pathlib import Path
from typing import Any

import _bundles as h
import numpy as np
import pytest

import dossier
from dossier.errors import (
    ExitCode,
    InputError,
    IntegrityError,
    InvalidHostError,
    SignatureError,
    SuboptimalHostError,
)
from dossier.npz import read_inputs
from dossier.run_once import run_bundle
from dossier.serve import Engine, SuboptimalWarning
from dossier.verify import refused_report
from dossier.verify.policy import Verdict


def _host(bundle: Path, tmp_path: Path, edit: Any = None) -> Path:
    fp = json.loads((bundle / "fingerprint.json").read_text())
    if edit is not None:
        edit(fp)
    path = tmp_path / f"host-{len(list(tmp_path.glob('host-*')))}.json"
    path.write_text(json.dumps(fp))
    return path


def _pairs(bundle: Path) -> Any:
    from dossier.validation import load_validation_set

    return load_validation_set(bundle / "validation").pairs


@pytest.fixture
def loads(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every native loader the backends reach (ONNX Runtime sessions, any backend's load),
    recorded as it is called."""
    import onnxruntime as ort

    from dossier.backends.interface import Backend

    calls: list[str] = []
    session, backend_load = ort.InferenceSession, Backend.load

    def recording_session(*args: Any, **kwargs: Any) -> Any:
        what = args[0] if args else kwargs.get("path_or_bytes")
        calls.append("onnxruntime.InferenceSession" + (f"({Path(what).name})" if isinstance(
            what, (str, os.PathLike)) else "(bytes)"))
        return session(*args, **kwargs)

    def recording_load(self: Backend, *args: Any, **kwargs: Any) -> Any:
        calls.append(f"{self.name}.load")
        return backend_load(self, *args, **kwargs)

    monkeypatch.setattr(ort, "InferenceSession", recording_session)
    monkeypatch.setattr(Backend, "load", recording_load)
    return calls


# ------------------------------------------------------------------------------- the engine
def test_outputs_equal_the_tuner_workers(bundle: Path, tmp_path: Path,
                                         loads: list[str]) -> None:
    """The engine's outputs are those of the engine loaded as the tuner's worker loads it (in
    this process), and their losses those the worker computes in its own child process
    (``verify --recheck``)."""
    from dossier.jobs.worker import WorkerRequest, _backend
    from dossier.routes import Route
    from dossier.validation import ValidationSet, judge
    from dossier.verify import VerifyOptions, verify

    host = _host(bundle, tmp_path)
    engine = dossier.load(bundle, host=host)
    assert loads[0] == "onnxruntime.load"  # after the verification; the engine opened once
    assert loads.count("onnxruntime.InferenceSession(convnet.ort)") == 1
    assert isinstance(engine, Engine) and engine.backend == "onnxruntime"
    assert engine.inputs == ("x",) and engine.outputs == ("logits",)
    manifest = json.loads((bundle / "manifest.json").read_text())
    assert engine.route == manifest["engines"]["shipped"]["route"]
    assert engine.bundle_id == manifest["dossier_id"] == engine.report.dossier_id
    assert engine.report.verdict is Verdict.VALID
    pairs = _pairs(bundle)
    req = WorkerRequest(backend="onnxruntime", model="", validation=str(bundle / "validation"),
                        metric="linf", threshold=1.0, atol=0, rtol=0, timing=_timing(),
                        timeout_s=120.0, baseline_route="", result=str(tmp_path / "r.json"),
                        stage=str(tmp_path / "stage"), mode="validate")
    worker = _backend(req).load(bundle / manifest["engines"]["shipped"]["path"],
                                Route.parse(engine.route))
    ours = {p.name: engine(p.inputs) for p in pairs}
    for p in pairs:
        theirs = worker.run(p.inputs)
        assert ours[p.name].keys() == theirs.keys()
        for name in theirs:
            np.testing.assert_array_equal(ours[p.name][name], theirs[name])
    child = verify(bundle, VerifyOptions(host=host, recheck=True)).recheck
    assert child is not None and child.passed
    vset = ValidationSet(bundle / "validation", tuple(pairs))
    here = judge(ours, vset, child.metric, child.threshold)
    assert here.losses == child.losses  # the same numbers from the worker's own process


def _timing() -> Any:
    from conftest import TINY_TIMING

    return TINY_TIMING


def test_named_inputs_tensors_and_threads(bundle: Path, tmp_path: Path) -> None:
    engine = dossier.load(bundle, host=_host(bundle, tmp_path))
    x = _pairs(bundle)[0].inputs["x"]
    want = engine({"x": x})["logits"]
    np.testing.assert_array_equal(engine(x=x)["logits"], want)
    with pytest.raises(InputError, match="is float64; the engine takes float32"):  # never cast
        engine({"x": x.tolist()})
    torch = pytest.importorskip("torch")
    np.testing.assert_array_equal(engine(x=torch.from_numpy(x))["logits"], want)
    with pytest.raises(InputError, match="missing \\['x'\\]"):
        engine({})
    with pytest.raises(InputError, match="unknown \\['y'\\]"):
        engine(x=x, y=x)
    got: list[np.ndarray] = []

    def serve() -> None:
        for _ in range(20):
            got.append(engine(x=x)["logits"])

    threads = [threading.Thread(target=serve) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(got) == 80 and all(np.array_equal(g, want) for g in got)
    assert not engine.lock.locked()
    engine.close()
    with pytest.raises(dossier.errors.EngineFailedError, match="released"):
        engine(x=x)


# ------------------------------------------------------------------------------- refusals
def test_a_flipped_engine_byte_is_refused_before_any_loader(bundle: Path, tmp_path: Path,
                                                            loads: list[str]) -> None:
    import tarfile

    from dossier.bundle import pack_bundle

    packed = pack_bundle(bundle, tmp_path / "packed")
    engine = bundle / "engine" / "convnet.ort"
    data = bytearray(engine.read_bytes())
    data[len(data) // 2] ^= 0x01
    engine.write_bytes(bytes(data))
    with pytest.raises(IntegrityError, match="convnet.ort") as exc:
        dossier.load(bundle, host=_host(bundle, tmp_path))
    assert loads == []  # no session, no backend loader was created
    report = refused_report(exc.value)
    assert report is not None and report.exit_code == ExitCode.BUNDLE
    with tarfile.open(packed) as tar:  # the same damage inside an archive
        member = next(m for m in tar.getmembers() if m.name.endswith("convnet.ort"))
    with open(packed, "r+b") as f:
        f.seek(member.offset_data + member.size // 2)
        byte = f.read(1)
        f.seek(member.offset_data + member.size // 2)
        f.write(bytes([byte[0] ^ 0x01]))
    with pytest.raises(IntegrityError):
        dossier.load(packed, host=_host(bundle, tmp_path))
    assert loads == []


@pytest.fixture
def runtime_imports(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every ``Backend.import_runtime`` call, by backend and thread."""
    from dossier.backends.interface import Backend

    calls: list[str] = []
    real = Backend.import_runtime

    def recording(self: Backend) -> None:
        calls.append(f"{self.name} in {threading.current_thread().name}")
        real(self)

    monkeypatch.setattr(Backend, "import_runtime", recording)
    return calls


def test_the_runtime_is_imported_while_the_fingerprint_is_collected(
        bundle: Path, monkeypatch: pytest.MonkeyPatch, loads: list[str],
        runtime_imports: list[str]) -> None:
    """No ``host``: this host's fingerprint is collected in the background while load imports
    the backend's runtime. The stand-in collector waits for the import to begin and the
    import for the collector to have started: one after the other, a wait times out."""
    import dossier.verify.pipeline
    from dossier.backends.interface import Backend
    from dossier.fingerprint import load_fingerprint

    collecting, importing = threading.Event(), threading.Event()
    recording = Backend.import_runtime

    def collector(**kw: Any) -> Any:
        collecting.set()
        if not importing.wait(30):
            raise AssertionError("the runtime was not imported while the fingerprint was "
                                 "collected")
        assert loads == []  # no engine touched meanwhile
        return load_fingerprint(bundle / "fingerprint.json")  # VALID

    def waiting(self: Backend) -> None:
        importing.set()
        if not collecting.wait(30):
            raise AssertionError("the fingerprint was not being collected meanwhile")
        recording(self)

    monkeypatch.setattr(dossier.verify.pipeline, "collect", collector)
    monkeypatch.setattr(Backend, "import_runtime", waiting)
    engine = dossier.load(bundle)
    assert engine.report.verdict is Verdict.VALID and loads[0] == "onnxruntime.load"
    assert runtime_imports == [f"onnxruntime in {threading.current_thread().name}"]
    assert not any(t.name.startswith("dossier-fingerprint") for t in threading.enumerate())


def test_a_flipped_engine_byte_with_this_hosts_fingerprint_is_refused_before_any_loader(
        bundle: Path, loads: list[str], runtime_imports: list[str]) -> None:
    """This host's fingerprint collected in the background: the refusal comes at integrity
    as before, no loader reached; the runtime was imported (before the checks, by design:
    importing it reads no engine) and no thread is left."""
    engine = bundle / "engine" / "convnet.ort"
    data = bytearray(engine.read_bytes())
    data[len(data) // 2] ^= 0x01
    engine.write_bytes(bytes(data))
    with pytest.raises(IntegrityError, match="convnet.ort") as exc:
        dossier.load(bundle)
    assert loads == [] and runtime_imports == [
        f"onnxruntime in {threading.current_thread().name}"]
    report = refused_report(exc.value)
    assert report is not None and report.exit_code == ExitCode.BUNDLE
    assert not any(t.name.startswith("dossier-fingerprint") for t in threading.enumerate())


def test_importing_the_runtime_ahead_raises_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    """A runtime that fails to import: the load says so, in its words; the backend is kept."""
    from dossier.backends import get_backend
    from dossier.backends.interface import Backend
    from dossier.serve import _Handed

    def broken(self: Backend) -> None:
        raise OSError("libtorch_cpu.so: cannot open shared object file")

    monkeypatch.setattr(Backend, "import_runtime", broken)
    handed, backend = _Handed(), get_backend("onnxruntime")
    handed(backend)
    assert handed.backend is backend


def test_one_backend_instance_serves_a_load(bundle: Path, tmp_path: Path,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """The verification resolves the bundle's backend once: the runtime import, the policy,
    the requirements and the load all use that one instance."""
    from dossier.backends import registry
    from dossier.backends.interface import Backend

    made: list[Backend] = []
    used: list[tuple[str, Backend]] = []
    real_make, real_import, real_load = registry._load, Backend.import_runtime, Backend.load

    def making(name: str, target: Any) -> Backend:
        made.append(real_make(name, target))
        return made[-1]

    def importing(self: Backend) -> None:
        used.append(("import_runtime", self))
        real_import(self)

    def loading(self: Backend, *args: Any) -> Any:
        used.append(("load", self))
        return real_load(self, *args)

    monkeypatch.setattr(registry, "_load", making)
    monkeypatch.setattr(Backend, "import_runtime", importing)
    monkeypatch.setattr(Backend, "load", loading)
    dossier.load(bundle, host=_host(bundle, tmp_path)).close()
    assert [b.name for b in made] == ["onnxruntime"]
    assert [name for name, _ in used] == ["import_runtime", "load"]
    assert all(b is made[0] for _, b in used)


def test_signatures_under_require_signature(bundle: Path, tmp_path: Path,
                                            loads: list[str]) -> None:
    from dossier.trust.signing import generate_key_pair, sign_bundle

    keys = {n: generate_key_pair(tmp_path / "keys", n) for n in ("release", "stranger")}
    host = _host(bundle, tmp_path)
    with pytest.raises(SignatureError, match="is not signed"):
        dossier.load(bundle, require_signature=True, trusted_key=keys["release"].public,
                     host=host)
    with pytest.raises(SignatureError, match="no trusted key"):
        dossier.load(bundle, require_signature=True, host=host)
    assert loads == []
    sign_bundle(bundle, keys["release"].private)
    with pytest.raises(SignatureError, match="not signed by a trusted key"):
        dossier.load(bundle, require_signature=True, trusted_key=[keys["stranger"].public],
                     host=host)
    assert loads == []
    engine = dossier.load(bundle, require_signature=True, trusted_key=keys["release"].public,
                          host=host)
    assert engine.report.signature and "signed by trusted key" in engine.report.signature
    assert loads[0] == "onnxruntime.load" and "onnxruntime.InferenceSession(convnet.ort)" in loads


def test_another_host_is_invalid_and_a_suboptimal_one_warns(bundle: Path, tmp_path: Path,
                                                             loads: list[str]) -> None:
    other_ort = _host(bundle, tmp_path, lambda fp: fp["packages"].update(onnxruntime="1.31.1"))
    with pytest.raises(InvalidHostError, match="INVALID on this host: packages.onnxruntime") \
            as exc:
        dossier.load(bundle, host=other_ort)
    assert exc.value.exit_code == ExitCode.INVALID and loads == []
    report = refused_report(exc.value)
    assert report is not None and report.verdict is Verdict.INVALID
    other_cpu = _host(bundle, tmp_path, lambda fp: fp["cpu"].update(model="Some Other CPU"))
    with pytest.raises(SuboptimalHostError) as refused:
        dossier.load(bundle, host=other_cpu, on_suboptimal="refuse")
    assert refused.value.exit_code == ExitCode.SUBOPTIMAL and loads == []
    with pytest.warns(SuboptimalWarning, match="SUBOPTIMAL on this host: cpu.model"):
        engine = dossier.load(bundle, host=other_cpu)
    assert engine.report.verdict is Verdict.SUBOPTIMAL
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        dossier.load(bundle, host=other_cpu, on_suboptimal="ignore")
    with pytest.raises(InputError, match="on_suboptimal"):
        dossier.load(bundle, on_suboptimal="maybe")  # type: ignore[arg-type]


def test_a_real_other_host_is_invalid(bundle: Path) -> None:
    """No fingerprint given: this host is judged. The golden bundle was optimized at the
    layout level on another CPU; where this CPU differs, load refuses it (INVALID)."""
    from dossier.verify import verify

    verdict = verify(bundle).verdict
    if verdict is Verdict.INVALID:
        with pytest.raises(InvalidHostError):
            dossier.load(bundle)
    else:
        assert dossier.load(bundle).report.verdict is verdict


# --------------------------------------------------------------------------- import cost
_LOAD = """
import sys, numpy as np
import dossier
assert "dossier.serve" not in sys.modules and "numpy" in sys.modules
engine = dossier.load(sys.argv[1], host=sys.argv[2])
out = engine({"x": np.zeros((1, 3, 32, 32), np.float32)})
print(sorted(out))
"""


def test_loading_an_onnxruntime_bundle_imports_neither_scipy_pyarrow_nor_the_tuner(
        bundle: Path, tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(h.REPO), str(h.REPO / ".shim")])}
    res = subprocess.run([sys.executable, "-X", "importtime", "-c", _LOAD, str(bundle),
                          str(_host(bundle, tmp_path))], capture_output=True, text=True,
                         timeout=120, check=False, env=env)
    assert res.returncode == 0, res.stderr[-2000:]
    assert res.stdout.strip() == "['logits']"
    names = {ln.split("|")[-1].strip() for ln in res.stderr.splitlines()
             if ln.startswith("import time:")}
    assert {"dossier.serve", "dossier.verify"} <= names
    # onnxruntime's own line is missing when importlib.import_module imports it (the runtime
    # imported while the checks run): -X importtime times `import` statements only
    assert "onnxruntime.capi._pybind_state" in names
    heavy = {"scipy", "pyarrow", "dossier.tuner", "dossier.spec", "dossier.measure.confirmation",
             "dossier.strategies", "torch"}
    # every dossier name is a real module (a third-party one may be absent from this environment)
    assert all(importlib.util.find_spec(m) for m in heavy if m.startswith("dossier"))
    assert not heavy & names, heavy & names
    res = subprocess.run([sys.executable, "-X", "importtime", "-c", "import dossier"],
                         capture_output=True, text=True, timeout=60, check=False, env=env)
    cheap = {ln.split("|")[-1].strip() for ln in res.stderr.splitlines()
             if ln.startswith("import time:")}
    assert "dossier" in cheap and not {"numpy", "pydantic", "dossier.serve"} & cheap


# ------------------------------------------------------------------------------ dossier run
def _run(*args: object) -> Any:
    return h.cli("run", *args)


def test_run_exit_codes(bundle: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    host = ["--host-fingerprint", _host(bundle, tmp_path)]
    res = _run(bundle, "--check", *host)
    assert res.exit_code == 0, h.said(res)
    assert "OK: pair-000: worst linf loss" in res.stderr and "logits: float32 [2, 3, 32" \
        not in res.stdout
    pair = _pairs(bundle)[1]
    np.savez(tmp_path / "in.npz", **pair.inputs)
    res = _run(bundle, "-i", tmp_path / "in.npz", "-o", tmp_path / "out.npz", "--check",
               "--json", *host)
    assert res.exit_code == 0, h.said(res)
    data = json.loads(res.stdout)
    assert data["check"]["passed"] and data["check"]["pair"] == pair.name
    assert data["verdict"] == "VALID" and [s["name"] for s in data["steps"]][0] == "fetch"
    written = read_inputs(tmp_path / "out.npz")
    engine = dossier.load(bundle, host=host[1])
    np.testing.assert_array_equal(written["logits"], engine(pair.inputs)["logits"])
    # -o exists: refused before anything runs
    res = _run(bundle, "-i", tmp_path / "in.npz", "-o", tmp_path / "out.npz", *host)
    assert res.exit_code == ExitCode.OUTPUT
    # unusable inputs: exit 3
    (tmp_path / "junk.npz").write_bytes(b"not a zip")
    assert _run(bundle, "-i", tmp_path / "junk.npz", *host).exit_code == ExitCode.INPUT
    np.savez(tmp_path / "wrong.npz", y=pair.inputs["x"])
    res = _run(bundle, "-i", tmp_path / "wrong.npz", *host)
    assert res.exit_code == ExitCode.INPUT and "unknown ['y']" in res.stderr
    np.savez(tmp_path / "other.npz", x=pair.inputs["x"] + 1)
    res = _run(bundle, "-i", tmp_path / "other.npz", "--check", *host)
    assert res.exit_code == ExitCode.INPUT and "match none of the 3 validation pairs" in \
        res.stderr
    assert _run(bundle, "-i", tmp_path / "other.npz", *host).exit_code == 0  # no --check
    # the verdict
    other_cpu = _host(bundle, tmp_path, lambda fp: fp["cpu"].update(model="Other"))
    res = _run(bundle, "--host-fingerprint", other_cpu)
    assert res.exit_code == 0 and "warning: convnet-1" in res.stderr
    res = _run(bundle, "--host-fingerprint", other_cpu, "--refuse-suboptimal")
    assert res.exit_code == ExitCode.SUBOPTIMAL
    other_ort = _host(bundle, tmp_path, lambda fp: fp["packages"].update(onnxruntime="1.0"))
    assert _run(bundle, "--host-fingerprint", other_ort).exit_code == ExitCode.INVALID
    # signatures
    from dossier.trust.signing import generate_key_pair

    key = generate_key_pair(tmp_path / "keys", "k")
    assert _run(bundle, "--require-signature", *host).exit_code == ExitCode.USAGE
    res = _run(bundle, "--require-signature", "--trusted-key", key.public, *host)
    assert res.exit_code == ExitCode.SIGNATURE
    # outputs that miss the references: --check fails with exit 11
    from dossier.backends.onnxruntime.runner import OnnxRuntimeRunner

    real, real_fast = OnnxRuntimeRunner.run_impl, OnnxRuntimeRunner.fast_run
    monkeypatch.setattr(OnnxRuntimeRunner, "run_impl", lambda self, feed: {
        k: v + 1.0 for k, v in real(self, feed).items()})
    monkeypatch.setattr(OnnxRuntimeRunner, "fast_run", lambda self: (
        lambda feed, call=real_fast(self): {k: v + 1.0 for k, v in call(feed).items()}))
    res = _run(bundle, "--check", *host)
    assert res.exit_code == ExitCode.INVALID and "FAIL: pair-000" in res.stderr
    monkeypatch.undo()
    # a damaged bundle and no bundle: exit 6
    (bundle / "knobs.json").write_bytes(b"{}")
    assert _run(bundle, *host).exit_code == ExitCode.BUNDLE
    assert _run(tmp_path / "nowhere").exit_code == ExitCode.BUNDLE


def test_run_bundle_in_the_library(bundle: Path, tmp_path: Path) -> None:
    done = run_bundle(bundle, check=True, host=_host(bundle, tmp_path))
    assert done.check is not None and done.check.passed and done.inputs_from.endswith("pair-000")
    assert done.summary()["outputs"] == {"logits": {"shape": [1, 10], "dtype": "float32"}}
