"""The torch-inductor backend on the CPU: knob database, signatures, build/load, digests, tuning.

Each CPU build takes ~15-25 s on two cores; the tests not marked slow build three packages in
all: one shared engine built here, and the two of one tuning run, built in its child processes
(its baseline is the shared engine's route: the digest test compares the two builds).
"""

from __future__ import annotations

import json
import shutil
import tempfile
import zipfile
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from conftest import TINY_TIMING  # noqa: E402

from dossier.backends import BuildError, EngineRuntimeError, get_backend  # noqa: E402
from dossier.backends import torch_inductor as ti  # noqa: E402
from dossier.backends.torch_inductor import model as ti_model  # noqa: E402
from dossier.errors import ModelError  # noqa: E402
from dossier.routes import Route  # noqa: E402
from dossier.spec import load_spec  # noqa: E402
from dossier.trial import Outcome  # noqa: E402
from dossier.validation import judge, load_validation_set  # noqa: E402
from samples import torch_models  # noqa: E402

pytestmark = pytest.mark.torch

CPU = Route.parse("-device=cpu")
SHARED = Route.parse("-device=cpu -inductor:freezing=false")
"""The shared engine's route: the default build, named as the tuning run's baseline names it."""
SELECTION = "-device=cpu -inductor:freezing=[false|true]"
THRESHOLD = 1e-4  # the torch-mlp sample's linf threshold


@pytest.fixture(scope="module")
def backend() -> ti.TorchInductorBackend:
    b = get_backend("torch-inductor")
    assert isinstance(b, ti.TorchInductorBackend)
    return b


@pytest.fixture(scope="module")
def mlp_sample(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The torch-mlp sample (exported program, validation set, release.toml), built once."""
    return torch_models.build_torch_mlp(tmp_path_factory.mktemp("torch-samples")).parent


@pytest.fixture(scope="module")
def mlp_engine(backend: ti.TorchInductorBackend, mlp_sample: Path,
               tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, str]]:
    """One CPU build of the default route, shared by the tests that only load it."""
    engine = tmp_path_factory.mktemp("engines") / "mlp.pt2"
    info = backend.build(mlp_sample / "model.pt2", SHARED, engine)
    return engine, info.facts


@pytest.fixture(scope="module")
def mlp_tuned(mlp_sample: Path, tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    """A tuning run of the torch-mlp sample over freezing off (the baseline) and on: two builds
    in child processes."""
    from dossier.tuner import tune

    spec = load_spec(mlp_sample / "release.toml", {"selection": SELECTION})
    spec = spec.model_copy(update={"timing": TINY_TIMING.model_copy(
        update={"trial_timeout_s": 300.0})})
    run = tmp_path_factory.mktemp("torch-tune") / "run"
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(Path(__file__).resolve().parents[2])  # the trial processes import dossier here
        return run, tune(spec, run, spec_path=mlp_sample / "release.toml")


# ---------------------------------------------------------------------------- knob database
def test_knob_database_reads_defaults_from_torch(backend: ti.TorchInductorBackend) -> None:
    from torch._inductor import config

    db = backend.knob_database()
    current = config.get_config_copy()
    assert db.backend == "torch-inductor"
    assert db.tuner_version == f"torch {torch.__version__}"
    names = db.names()
    assert names[:3] == ["device", "dtype", "float32_matmul_precision"]
    for key, _help, _numerics in ti.INDUCTOR_KEYS:
        if key not in current:
            assert ti.KNOB_PREFIX + key not in names
            continue
        knob = db.get(ti.KNOB_PREFIX + key)
        want = "false" if key == "aot_inductor.precompile_headers" else ti.value_text(current[key])
        assert knob.default == want, key
        assert knob.values is not None and knob.default in knob.values
        assert len(set(knob.values)) == len(knob.values)
    assert db.get("inductor:max_autotune").default == ti.value_text(current["max_autotune"])
    assert db.get("inductor:cpp.simdlen").values[0] == "default"
    assert "dossier sets false" in db.get("inductor:aot_inductor.precompile_headers").help
    assert db.get("float32_matmul_precision").default == torch.get_float32_matmul_precision()
    device = db.get("device")
    assert device.default == ("cuda" if torch.cuda.is_available() else "cpu")
    numerics = {k.name for k in db.knobs if k.changes_numerics}
    assert {"dtype", "float32_matmul_precision", "inductor:cpp.enable_unsafe_math_opt_flag"} <= numerics
    # the CUDA graph replay and the number of engine instances serving, chosen at load
    assert {k.name for k in db.knobs if k.phase.value == "load"} == {"cuda_graph",
                                                                      "serving_sessions"}
    assert db.get("serving_sessions").values == ("1", "2", "4")
    assert db.get("cuda_graph").values == (("off", "on") if torch.cuda.is_available() else ("off",))
    assert db.digest() == backend.knob_database().digest()


def test_value_text_and_parse_value_round_trip() -> None:
    assert ti.value_text(True) == "true" and ti.value_text(None) == "default"
    assert ti.parse_value("true", False) is True
    assert ti.parse_value("default", None) is None
    assert ti.parse_value("512", None) == 512
    assert ti.parse_value("-1", -1) == -1
    assert ti.parse_value("ATEN,TRITON", "ATEN") == "ATEN,TRITON"
    assert ti.parse_value("7", ...) == 7 and ti.parse_value("x", ...) == "x"
    with pytest.raises(BuildError):
        ti.parse_value("yes", False)
    with pytest.raises(BuildError):
        ti.parse_value("wide", 4)


def test_plan_sets_only_non_default_keys(backend: ti.TorchInductorBackend) -> None:
    plan = backend.plan(Route.parse("-device=cpu -inductor:freezing=true -inductor:cpp.simdlen=256 "
                                    "-float32_matmul_precision=medium -dtype=bfloat16"))
    assert plan.device == "cpu" and plan.dtype == "bfloat16" and plan.precision == "medium"
    assert plan.configs == {"freezing": True, "cpp.simdlen": 256,
                            "aot_inductor.precompile_headers": False}
    override = backend.plan(Route.parse("-device=cpu -inductor:aot_inductor.precompile_headers=true"))
    assert override.configs == {"aot_inductor.precompile_headers": True}
    with pytest.raises(BuildError, match="unknown knob"):
        backend.plan(Route.of({"no_such": "1"}))


def test_engine_facts_and_stack(backend: ti.TorchInductorBackend) -> None:
    db = backend.knob_database()
    assert backend.engine_facts(CPU, db) == {"cpu_package": True, "march_native": True}
    assert backend.timing_defaults(CPU, db) == {}
    assert backend.timing_defaults(Route.of({"device": "cuda"}), db) == {"confirm_processes": 6}
    stack = backend.stack()
    assert stack["torch"] == torch.__version__
    assert "cxx" not in stack or stack["cxx"]


# ---------------------------------------------------------------------------- signatures
def test_signature_of_factory_and_exported_program(backend: ti.TorchInductorBackend,
                                                   mlp_sample: Path) -> None:
    from_factory = backend.signature(Path("samples.torch_models:tiny_mlp"))
    from_file = backend.signature(mlp_sample / "model.pt2")
    assert from_factory == from_file
    assert from_file.inputs[0].name == "x" and from_file.inputs[0].shape == ("batch", 64)
    vset = load_validation_set(mlp_sample / "validation")
    for pair in vset.pairs:
        from_file.check_pair(pair.name, pair.inputs, pair.references)


def test_signature_read_from_a_plain_exported_program(backend: ti.TorchInductorBackend,
                                                      tmp_path: Path) -> None:
    model = torch_models.tiny_mlp()
    batch = torch.export.Dim("batch", min=1)
    ep = torch.export.export(model, (torch.randn(2, 64),), dynamic_shapes=({0: batch},))
    path = tmp_path / "plain.pt2"
    torch.export.save(ep, str(path))
    sig = backend.signature(path)
    assert [t.name for t in sig.inputs] == ["input"]
    assert sig.inputs[0].dtype == "float32"
    assert isinstance(sig.inputs[0].shape[0], str) and sig.inputs[0].shape[1] == 64
    assert [t.name for t in sig.outputs] == ["output"]
    assert sig.outputs[0].shape[1] == 16


def test_signature_errors(backend: ti.TorchInductorBackend, tmp_path: Path,
                          mlp_engine: tuple[Path, dict[str, str]]) -> None:
    with pytest.raises(ModelError, match="does not exist"):
        backend.signature(tmp_path / "missing.pt2")
    with pytest.raises(ModelError, match="cannot import"):
        backend.signature(Path("no_such_module_here:factory"))
    with pytest.raises(ModelError, match="no callable"):
        backend.signature(Path("samples.torch_models:no_such_factory"))
    with pytest.raises(ModelError, match="is ONNX: the torch-inductor backend takes"):
        backend.signature(tmp_path / "model.onnx")
    with pytest.raises(ModelError, match="AOTInductor package"):
        backend.signature(mlp_engine[0])
    bad = tmp_path / "bad.pt2"
    bad.write_bytes(b"not a zip")
    with pytest.raises(ModelError, match="not a readable exported program"):
        backend.signature(bad)
    with pytest.raises(ModelError, match="no 'outputs'"):
        ti_model.signature_from_dict({"inputs": {"x": ("float32", (1,))}}, "here")
    with pytest.raises(ModelError, match="not \\(dtype, shape\\)"):
        ti_model.signature_from_dict({"inputs": {"x": ("float33", (1,))},
                                "outputs": {"y": ("float32", (1,))}}, "here")


# ---------------------------------------------------------------------------- build and load
def test_build_load_reproduces_eager_and_reference(backend: ti.TorchInductorBackend,
                                                   mlp_sample: Path,
                                                   mlp_engine: tuple[Path, dict[str, str]]) -> None:
    engine, facts = mlp_engine
    assert facts["device"] == "cpu" and facts["cpu_package"] == "true"
    assert facts["aoti_device_key"] == "cpu" and "aoti_cpu_isa" in facts
    assert facts["torch"] == torch.__version__
    # the compiler and how the package links libstdc++, read back from the package itself
    from dossier import cxx_runtime

    link = cxx_runtime.package_linkage(engine)
    assert link is not None and facts["libstdcxx"] == link.libstdcxx
    assert facts["cxx_path"] == cxx_runtime.choose().compiler.path  # type: ignore[union-attr]
    assert ("load_hint" in facts) == (link.libstdcxx == cxx_runtime.STATIC)
    meta = ti.package_metadata(engine)
    assert meta["dossier.route"] == SHARED.text()
    assert meta["dossier.torch"] == torch.__version__
    assert json.loads(meta["dossier.inputs"]) == ["x"]

    model = torch_models.tiny_mlp()
    vset = load_validation_set(mlp_sample / "validation")
    with backend.load(engine, SHARED) as runner:
        outputs = {}
        for pair in vset.pairs:
            got = runner.run(pair.inputs)
            assert set(got) == {"y"} and got["y"].dtype == np.float32
            with torch.no_grad():
                eager = model(torch.from_numpy(pair.inputs["x"])).numpy()
            np.testing.assert_allclose(got["y"], eager, atol=1e-5, rtol=0)
            outputs[pair.name] = got
            prepared = runner.prepare(pair.inputs)
            with pytest.raises(TypeError, match="mapping of input name"):
                runner.prepare(prepared)  # prepare takes host arrays (checked once, in Runner)
            times = [runner.timed(prepared) for _ in range(3)]
            assert all(t > 0 for t in times)
        acc = judge(outputs, vset, "linf", THRESHOLD)
        assert acc, acc.failure
        assert acc.worst is not None and acc.worst < 1e-5
        with pytest.raises(EngineRuntimeError, match="missing"):
            runner.run({})


def test_engine_instances_answer_from_threads_as_one_does(
        backend: ti.TorchInductorBackend, mlp_sample: Path,
        mlp_engine: tuple[Path, dict[str, str]]) -> None:
    """-serving_sessions=2: the package loaded twice, each instance called from a thread of its
    own at the same time, gives what one instance gives alone (a server's engine instances)."""
    import threading

    engine, _ = mlp_engine
    route = Route.parse("-device=cpu -serving_sessions=2 -inductor:freezing=false")
    feeds = [p.inputs for p in load_validation_set(mlp_sample / "validation").pairs]
    with backend.load(engine, SHARED) as one:
        want = [one.run(f)["y"] for f in feeds]
    runners = [backend.load(engine, route) for _ in range(2)]
    got: list[list[np.ndarray]] = [[], []]
    errors: list[BaseException] = []
    start = threading.Barrier(2)

    def serve(k: int) -> None:
        try:
            start.wait()
            for _ in range(20):
                got[k].extend(runners[k].run(f)["y"] for f in feeds)
        except BaseException as exc:  # noqa: BLE001 - said below
            errors.append(exc)
    threads = [threading.Thread(target=serve, args=(k,)) for k in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for r in runners:
        r.close()
    assert not errors
    for k in range(2):
        assert len(got[k]) == 20 * len(feeds)
        for i, y in enumerate(got[k]):
            np.testing.assert_array_equal(y, want[i % len(feeds)])


def test_the_load_recipe_names_the_engine_instances(backend: ti.TorchInductorBackend) -> None:
    db = backend.knob_database()
    one = backend.production_load(Route.parse("-device=cpu"), db)
    assert "serving_sessions" not in one.options and "instances" not in one.note
    cpu = backend.production_load(Route.parse("-device=cpu -serving_sessions=4"), db)
    assert cpu.options["serving_sessions"] == "4"
    assert cpu.snippet.startswith("# serve with 4 engine instances in parallel")
    assert "sys.setswitchinterval(0.0002)" in cpu.snippet
    assert "4 engine instances in parallel" in cpu.note and "stream" not in cpu.note
    assert cpu.snippet.endswith(one.snippet)
    # recorded routes are checked without torch's database: the knob is known there too
    assert backend.check_recorded_route("-device=cuda -cuda_graph=on -serving_sessions=2")


def test_unknown_inductor_key_is_a_build_error(backend: ti.TorchInductorBackend, mlp_sample: Path,
                                               tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    monkeypatch.delenv(ti.CACHE_ENV, raising=False)
    engine = tmp_path / "never.pt2"
    route = Route.of({"device": "cpu", "inductor:no_such_key_at_all": "true"})
    with pytest.raises(BuildError, match="unknown inductor config key"):
        backend.build(mlp_sample / "model.pt2", route, engine)
    assert not engine.exists()
    assert not [p for p in scratch.iterdir() if p.name.startswith(ti.TEMP_PREFIX)]


def test_native_errors_map_to_build_errors() -> None:
    from torch._dynamo.exc import UserError, UserErrorType
    from torch._inductor.exc import CppCompileError, CUDACompileError, InductorError

    cpp = CppCompileError(["g++", "k.cpp"], "k.cpp:7: internal compiler error: Segmentation fault")
    cases = [
        (InductorError(cpp, None), "internal compiler error"),
        (cpp, "internal compiler error"),
        (CUDACompileError(["nvcc"], "k.cu(3): error: identifier undefined"), "error:"),
        (AttributeError("torch._inductor.config.nope does not exist"), "unknown inductor config"),
        (UserError(UserErrorType.CONSTRAINT_VIOLATION, "dim specialized"), "dim specialized"),
        (RuntimeError("boom"), "boom"),
    ]
    for exc, text in cases:
        err = ti.map_build_error(exc, "compile")
        assert isinstance(err, BuildError)
        assert str(err).startswith("compile failed: ") and text in str(err), str(err)
        assert len(str(err)) < 600


def test_load_refuses_what_is_not_a_dossier_package(backend: ti.TorchInductorBackend,
                                                    tmp_path: Path) -> None:
    bad = tmp_path / "bad.pt2"
    bad.write_bytes(b"PK garbage")
    with pytest.raises(EngineRuntimeError, match="not a readable"):
        backend.load(bad, CPU)


# ---------------------------------------------------------------------------- identity
def test_normalized_digest_is_equal_across_builds(tmp_path: Path, mlp_tuned,  # type: ignore[no-untyped-def]
                                                  mlp_engine: tuple[Path, dict[str, str]]) -> None:
    first, facts = mlp_engine  # built in this process
    run, result = mlp_tuned
    baseline = next(t for t in result.cache.trials if t.role == "baseline")
    assert baseline.route == SHARED.text() and baseline.engine
    second = run / baseline.engine  # the same route built by a trial process, under another name
    assert second.name != first.name
    assert ti.normalized_digest(first) == ti.normalized_digest(second)
    assert facts["normalized_digest"] == baseline.extra["normalized_digest"]

    # a change inside the package changes the digest
    altered = tmp_path / "altered.pt2"
    with zipfile.ZipFile(first) as src, zipfile.ZipFile(altered, "w") as dst:
        for item in src.infolist():
            data = src.read(item)
            if item.filename.endswith(".wrapper.cpp"):
                data += b"\n// one more line\n"
            dst.writestr(item, data)
    assert ti.normalized_digest(altered) != ti.normalized_digest(first)


def test_normalized_digest_ignores_temp_paths_and_code_hashes(tmp_path: Path) -> None:
    def package(path: Path, tmp: str, code: str) -> Path:
        with zipfile.ZipFile(path, "w") as z:
            z.writestr(f"{path.stem}/data/aotinductor/model/{code}.wrapper.cpp",
                       f"// g++ /tmp/{ti.TEMP_PREFIX}{tmp}/x/{code}.cpp -O3\nint f();\n")
            z.writestr(f"{path.stem}/.data/serialization_id", tmp)
        return path

    a = package(tmp_path / "a.pt2", "abcd1234", "c" + "a" * 51)
    b = package(tmp_path / "b.pt2", "zz_y9876", "c" + "b" * 51)
    assert ti.normalized_digest(a) == ti.normalized_digest(b)
    with pytest.raises(EngineRuntimeError):
        ti.normalized_digest(tmp_path / "missing.pt2")


# ---------------------------------------------------------------------------- tuning
def test_tune_pipeline_on_the_torch_mlp_sample(mlp_tuned) -> None:  # type: ignore[no-untyped-def]
    run, result = mlp_tuned
    trials = [t for t in result.cache.trials if t.role != "confirm"]
    assert [t.role for t in trials] == ["baseline", "search"]
    assert [t.route for t in trials] == ["-device=cpu -inductor:freezing=false",
                                         "-device=cpu -inductor:freezing=true"]
    # trial_prestart is on for AOTInductor: each trial's process started on standby (the
    # first's while its build ran, the second's as the first began or while its own build
    # ran); the last started none (no next route)
    assert all(t.phases_s["standby"] > 0 for t in trials) and "wait" not in trials[-1].phases_s
    for t in trials:
        assert t.outcome is Outcome.OK, t.reason
        assert t.worst_loss is not None and t.worst_loss < THRESHOLD
        assert t.extra["cpu_package"] == "true" and t.extra["normalized_digest"]
        assert t.build_s is not None and t.build_s > 0
    decision = result.decision
    assert decision.baseline_route == trials[0].route
    assert decision.shipped_route in {t.route for t in trials}
    assert decision.reason
    knobs = json.loads((run / "knobs.json").read_text())
    assert knobs["backend"] == "torch-inductor"
    confirms = [t for t in result.cache.trials if t.role == "confirm"]
    assert confirms  # the confirmation's processes: each but the first started on standby
    assert all(t.phases_s["standby"] > 0 and t.phases_s["process"] > 0 for t in confirms)


# ---------------------------------------------------------------------------- slow
@pytest.mark.slow
def test_bfloat16_build_casts_inside_and_returns_float32(backend: ti.TorchInductorBackend,
                                                         mlp_sample: Path, tmp_path: Path) -> None:
    route = Route.parse("-device=cpu -dtype=bfloat16")
    engine = tmp_path / "bf16.pt2"
    info = backend.build(mlp_sample / "model.pt2", route, engine)
    assert info.facts["dtype"] == "bfloat16"
    vset = load_validation_set(mlp_sample / "validation")
    with backend.load(engine, route) as runner:
        outputs = {p.name: runner.run(p.inputs) for p in vset.pairs}
    assert all(o["y"].dtype == np.float32 for o in outputs.values())
    acc = judge(outputs, vset, "linf", THRESHOLD)
    assert not acc  # bf16 is far outside the float32 threshold
    assert acc.worst is not None and 1e-4 < acc.worst < 0.5
    assert judge(outputs, vset, "cos", 1e-3)


@pytest.mark.slow
def test_factory_reference_builds_a_convnet(backend: ti.TorchInductorBackend,
                                            tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(Path(__file__).resolve().parents[2])
    ref = Path("samples.torch_models:tiny_convnet")
    route = Route.parse("-device=cpu -inductor:freezing=true")
    engine = tmp_path / "convnet.pt2"
    backend.build(ref, route, engine)
    model = torch_models.tiny_convnet()
    with backend.load(engine, route) as runner:
        for batch in (1, 3):
            x = np.random.default_rng(batch).standard_normal((batch, 3, 32, 32)).astype(np.float32)
            with torch.no_grad():
                eager = model(torch.from_numpy(x)).numpy()
            np.testing.assert_allclose(runner.run({"x": x})["logits"], eager, atol=1e-4, rtol=0)


@pytest.mark.slow
def test_a_persistent_cache_folder_is_kept(backend: ti.TorchInductorBackend, mlp_sample: Path,
                                           tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cache = tmp_path / "cache"
    monkeypatch.setenv(ti.CACHE_ENV, str(cache))
    backend.build(mlp_sample / "model.pt2", CPU, tmp_path / "warm.pt2")
    assert cache.is_dir() and any(cache.iterdir())
    shutil.rmtree(cache)


def test_committed_torch_mlp_spec_matches_the_generator() -> None:
    root = Path(__file__).resolve().parents[2]
    committed = (root / "samples" / "torch-mlp" / "release.toml").read_text(encoding="utf-8")
    assert committed == torch_models.TORCH_MLP_TOML


@pytest.mark.slow
def test_bench_scripts_run_on_a_cpu(tmp_path: Path) -> None:
    """bench/h200 end to end on tiny models: specs, eager, a fast search, two A/A runs, summary."""
    import os
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[2]
    out = tmp_path / "out"
    env = {**os.environ, "OUT": str(out), "BENCH_WORK": str(tmp_path / "work"),
           "BENCH_DEVICE": "cpu", "BENCH_TINY": "1", "BENCH_TAG": "t", "PYTHON": sys.executable,
           "DEADLINE_S": "900"}
    subprocess.run(["bash", str(root / "bench" / "h200" / "run.sh"), "smoke"], cwd=root, env=env,
                   check=True, timeout=1000)
    data = json.loads((out / "h200-t.json").read_text())
    steps = {s["step"]: s for s in data["steps"]}
    assert steps["tune"]["ok"] and steps["tune"]["decision"] and steps["tune"]["fresh"]["ok"]
    assert steps["aa"]["reps_done"] == 2
    assert steps["release"]["reps_done"] == 1 and steps["release"]["runs"][0]["confirmation"]
    summary = tmp_path / "calibration"
    subprocess.run([sys.executable, str(root / "bench" / "h200" / "calibration_summary.py"),
                    str(out / "h200-t.json"), "--out", str(summary)], check=True)
    assert json.loads(summary.with_suffix(".json").read_text())["releases"]["tiny_mlp_b8"][
        "releases"] == 1
    md = tmp_path / "h200.md"
    subprocess.run([sys.executable, str(root / "bench" / "h200" / "summarize.py"), str(out),
                    "--out-json", str(tmp_path / "h200.json"), "--out-md", str(md)], check=True)
    assert "tiny_mlp_b8" in md.read_text()
