"""The backend registry (entry points, in-process registration) and the checks and error mapping
the Backend and Runner base classes put around the ``*_impl`` methods of every backend."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import ClassVar

import numpy as np
import pytest

from dossier.backends import (
    Backend,
    BuildError,
    BuildInfo,
    EngineRuntimeError,
    ModelSignature,
    Runner,
    TensorSpec,
    backend_names,
    default_policy,
    get_backend,
    register_backend,
    unregister_backend,
)
from dossier.errors import BackendUnavailableError, InputError, ModelError, SelectionError
from dossier.knobs import Knob, KnobDatabase
from dossier.routes import Route

REPO = Path(__file__).resolve().parents[2]


class NativeFailure(RuntimeError):
    """What a compiler library raises."""


class _ToyRunner(Runner):
    def __init__(self, fail: BaseException | None = None) -> None:
        self.fail, self.closed_times = fail, 0

    def run_impl(self, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        if self.fail is not None:
            raise self.fail
        return {"y": inputs["x"] * 2}

    def close_impl(self) -> None:
        self.closed_times += 1


class _ToyBackend(Backend):
    """A backend whose compiler is a function of the test: it writes ``route`` text as the
    engine, or raises what ``fail`` says."""

    name = "toy"
    engine_suffix = ".toy"
    requirement = "nothing"
    native_errors: ClassVar[tuple[type[Exception], ...]] = (NativeFailure,)

    def __init__(self, fail: BaseException | None = None, write: bool = True,
                 here: bool = True) -> None:
        self.fail, self.write, self.here, self.db_reads = fail, write, here, 0

    def available(self) -> bool:
        return self.here

    def knob_database_impl(self) -> KnobDatabase:
        self.db_reads += 1
        return KnobDatabase(backend=self.name, tuner_version="toy 1",
                            knobs=(Knob(name="k", values=("a", "b"), default="a"),))

    def signature_impl(self, model: Path) -> ModelSignature:
        return ModelSignature((TensorSpec("x", "float32", (2,)),),
                              (TensorSpec("y", "float32", (2,)),))

    def build_impl(self, model: Path, route: Route, engine: Path) -> BuildInfo:
        if self.fail is not None:
            raise self.fail
        if self.write:
            engine.write_text(route.text())
        return BuildInfo({"route": route.text()})

    def load_impl(self, engine: Path, route: Route) -> Runner:
        if self.fail is not None:
            raise self.fail
        return _ToyRunner()

    def loader_env_impl(self, engine: Path) -> dict[str, str]:
        return {f"TOY_{engine.stem.upper()}": engine.name}


@pytest.fixture
def toy_registered() -> Iterator[None]:
    register_backend("toy", _ToyBackend)
    yield
    unregister_backend("toy")


# ----------------------------------------------------------------------------- the registry
def test_the_shipped_backends_come_from_entry_points_and_the_test_backend_is_hidden() -> None:
    assert backend_names() == ["onnxruntime", "tensorrt", "torch-inductor"]
    assert backend_names(include_tests=True) == ["faulty", "landscape", "onnxruntime", "tensorrt",
                                                 "torch-inductor"]
    for name in backend_names(include_tests=True):
        backend = get_backend(name)
        assert backend.name == name and isinstance(backend, Backend)
    assert get_backend("faulty").for_tests and not get_backend("onnxruntime").for_tests
    with pytest.raises(SelectionError, match="unknown backend 'tensorflow'") as info:
        get_backend("tensorflow")
    assert info.value.hint == "use one of: onnxruntime, tensorrt, torch-inductor"


def test_looking_up_every_backend_and_its_policy_imports_no_compiler() -> None:
    """``import dossier`` and the registry stay light: a host without torch or TensorRT reads,
    verifies and explains bundles of every backend."""
    code = textwrap.dedent("""
        import json, sys
        import dossier
        from dossier.backends import backend_names, default_policy, get_backend
        for name in backend_names(include_tests=True):
            get_backend(name).engine_suffix
            default_policy(name)
        print(json.dumps(sorted(m for m in ("torch", "onnxruntime", "tensorrt", "cuda")
                                if m in sys.modules)))
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, cwd=REPO)
    assert json.loads(out.stdout) == []


def test_a_plugin_backend_is_found_through_its_entry_point(tmp_path: Path) -> None:
    """A distribution on the path that declares a ``dossier.backends`` entry point adds a
    backend to every process that has it on its path (as trial processes do), without any
    switch of dossier's."""
    site = tmp_path / "site"
    (site / "probe_plugin-1.dist-info").mkdir(parents=True)
    (site / "probe_plugin-1.dist-info" / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: probe-plugin\nVersion: 1\n")
    (site / "probe_plugin-1.dist-info" / "entry_points.txt").write_text(
        "[dossier.backends]\nprobe = probe_backend:ProbeBackend\n")
    (site / "probe_backend.py").write_text(textwrap.dedent("""
        from dossier.backends.onnxruntime import OnnxRuntimeBackend

        class ProbeBackend(OnnxRuntimeBackend):
            name = "probe"
    """))
    code = ("from dossier.backends import backend_names, get_backend\n"
            "print(backend_names(), type(get_backend('probe')).__name__)")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), str(REPO)])}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                         cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["['onnxruntime',", "'probe',", "'tensorrt',",
                                  "'torch-inductor']", "ProbeBackend"]
    env["PYTHONPATH"] = str(REPO)  # without the distribution: unknown
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                         cwd=tmp_path)
    assert out.returncode != 0 and "unknown backend 'probe'" in out.stderr


def test_register_backend_in_process(toy_registered: None) -> None:
    assert "toy" in backend_names() and isinstance(get_backend("toy"), _ToyBackend)
    assert get_backend("toy") is not get_backend("toy")  # a fresh instance each time
    register_backend("toy2", "tests._stress_backend:StressBackend")  # a reference, imported late
    try:
        assert get_backend("toy2").name == "stress" and get_backend("toy2").for_tests
    finally:
        unregister_backend("toy2")
    with pytest.raises(SelectionError):
        get_backend("toy2")
    register_backend("not-a-backend", dict)  # type: ignore[arg-type]
    try:
        with pytest.raises(TypeError, match="not a dossier Backend"):
            get_backend("not-a-backend")
    finally:
        unregister_backend("not-a-backend")


def test_policies_come_from_the_backend(toy_registered: None) -> None:
    """The test backend inherits ONNX Runtime's rules; a backend that contributes none has no
    default policy (as an unknown backend)."""
    assert default_policy("faulty") == default_policy("onnxruntime")
    assert default_policy("torch-inductor") != default_policy("tensorrt")
    for name in ("toy", "tensorflow"):
        with pytest.raises(InputError, match=f"no verify policy for backend '{name}'"):
            default_policy(name)


# ----------------------------------------------------------------------------- Backend
def test_build_maps_native_errors_once_and_passes_the_rest(tmp_path: Path) -> None:
    model, engine = tmp_path / "m.onnx", tmp_path / "out" / "e.toy"
    model.write_bytes(b"model")
    info = _ToyBackend().build(model, Route.of({"k": "b"}), engine)
    assert engine.read_text() == "-k=b" and info.facts == {"route": "-k=b"}
    with pytest.raises(BuildError, match="^compiler said no$") as caught:
        _ToyBackend(NativeFailure("compiler said no\nat line 3")).build(model, Route.of({}), engine)
    assert isinstance(caught.value.__cause__, NativeFailure)
    assert not engine.exists()  # the old engine was removed before building
    with pytest.raises(KeyError):  # not a native error of this backend: a bug, not a build
        _ToyBackend(KeyError("k")).build(model, Route.of({}), engine)
    with pytest.raises(MemoryError):  # a crash, not a failed build
        _ToyBackend(MemoryError()).build(model, Route.of({}), engine)
    with pytest.raises(BuildError, match="toy wrote no engine"):
        _ToyBackend(write=False).build(model, Route.of({}), engine)
    with pytest.raises(BackendUnavailableError, match="not installed") as absent:
        _ToyBackend(here=False).build(model, Route.of({}), engine)
    assert absent.value.hint == "install it: nothing"


def test_load_checks_the_engine_and_maps_native_errors(tmp_path: Path) -> None:
    engine = tmp_path / "e.toy"
    with pytest.raises(EngineRuntimeError, match="cannot read engine .*e.toy: no such file"):
        _ToyBackend().load(engine, Route.of({}))
    engine.write_text("")
    with pytest.raises(EngineRuntimeError, match="^bad plan$"):
        _ToyBackend(NativeFailure("bad plan")).load(engine, Route.of({}))
    with _ToyBackend().load(engine, Route.of({})) as runner:
        assert runner.run({"x": np.ones(2, np.float32)})["y"].tolist() == [2.0, 2.0]


def test_signature_knob_database_and_loader_env(tmp_path: Path) -> None:
    backend = _ToyBackend()
    with pytest.raises(ModelError, match="does not exist"):
        backend.signature(tmp_path / "absent.onnx")
    (tmp_path / "m.onnx").write_bytes(b"")
    assert backend.signature(tmp_path / "m.onnx").inputs[0].name == "x"
    assert backend.knob_database() is backend.knob_database() and backend.db_reads == 1
    a, b = tmp_path / "a.toy", tmp_path / "b.toy"
    a.write_text("")
    b.write_text("")
    assert backend.loader_env(a, None, tmp_path / "absent.toy", str(b)) == {
        "TOY_A": "a.toy", "TOY_B": "b.toy"}
    assert backend.loader_env() == {}


# ----------------------------------------------------------------------------- Runner
def test_runner_checks_inputs_maps_native_errors_and_closes_once() -> None:
    x = {"x": np.ones(2, np.float32)}
    runner = _ToyRunner()
    with pytest.raises(TypeError, match="mapping of input name"):
        runner.run({"x": [1.0, 2.0]})  # type: ignore[dict-item]
    with pytest.raises(TypeError):
        runner.prepare([x["x"]])  # type: ignore[arg-type]
    prepared = runner.prepare(x)
    assert runner.timed(prepared) > 0
    runner.close()
    runner.close()
    assert runner.closed_times == 1
    for call in (lambda: runner.run(x), lambda: runner.prepare(x), lambda: runner.timed(x)):
        with pytest.raises(EngineRuntimeError, match="released"):
            call()
    with pytest.raises(EngineRuntimeError, match="^kernel failed$"):
        _ToyRunner(RuntimeError("kernel failed\ndetail")).run(x)
    with pytest.raises(EngineRuntimeError, match="^kernel failed$"):
        _ToyRunner(RuntimeError("kernel failed")).timed(x)
    with pytest.raises(MemoryError):
        _ToyRunner(MemoryError()).run(x)


def test_a_runner_that_takes_tensors_runs_them_itself() -> None:
    """``run_tensors`` is offered (``dossier.load`` passes device tensors through) only where
    the runner has its own ``run_tensors_impl``; the base one refuses."""
    from dossier_test_backends.faulty.backend import _FaultyRunner

    from dossier.backends.interface import Runner
    from dossier.backends.onnxruntime.runner import OnnxRuntimeRunner
    from dossier.backends.tensorrt.runner import TensorRTRunner
    from dossier.backends.torch_inductor.runner import TorchInductorRunner

    runners = (TorchInductorRunner, OnnxRuntimeRunner, TensorRTRunner, _FaultyRunner)
    for cls in runners:
        own = cls.run_tensors_impl is not Runner.run_tensors_impl
        assert own == cls.takes_tensors, cls
    assert TorchInductorRunner.takes_tensors  # the one that does, today


def test_the_faulty_backends_clock_reads_the_known_speed_however_long_a_run_takes() -> None:
    """``pace=clock``: the engine still runs (here a stand-in that takes 20 ms, as a run on a
    busy host may), but a timed run reads the route's known time on the simulated clock, 2.0 ms
    over the gain, with a small noise; two loads of one route read alike in distribution, not in
    sequence. ``pace=held`` and ``off`` keep the real clock."""
    import time

    from dossier_test_backends.faulty.backend import CLOCK_NOISE, _FaultyRunner, clock, paced_ms

    from dossier.backends.interface import Runner

    class Slow(Runner):
        runs = 0

        def run_impl(self, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
            Slow.runs += 1
            time.sleep(0.02)
            return dict(inputs)

    x = {"x": np.zeros((1, 2), np.float32)}
    gain = Route.parse("-gain=x1.25 -pace=clock")
    first, second = (_FaultyRunner(Slow(), "none", 0.0, clock(gain)) for _ in range(2))
    a = [first.timed(first.prepare(x)) for _ in range(20)]
    b = [second.timed(second.prepare(x)) for _ in range(20)]
    assert Slow.runs == 40  # every timed run ran the engine
    for reads in (a, b):
        assert all(abs(np.log(r / 1.6)) < 5 * CLOCK_NOISE for r in reads), reads
        assert 0 < np.std(np.log(reads)) < 2 * CLOCK_NOISE  # not degenerate
    assert a != b and abs(np.mean(np.log(a)) - np.mean(np.log(b))) < 2 * CLOCK_NOISE
    slow = clock(Route.parse("-fault=slow -pace=clock"))
    assert slow is not None and slow.ms == 4.0  # fault=slow adds its 2 ms on the clock
    drift = clock(Route.parse("-fault=drift -gain=x1.25 -pace=clock"))
    assert drift is not None and drift.ms == pytest.approx(2.0 / 1.25 / 1.5)
    for real in ("-gain=x1.25 -pace=held", "-gain=x1.25"):  # the real clock
        assert clock(Route.parse(real)) is None
        runner = _FaultyRunner(Slow(), "none", 0.0, None)
        assert runner.timed(runner.prepare(x)) >= 20.0
    assert paced_ms(Route.parse("-gain=x1.25 -pace=held")) == paced_ms(gain) == 1.6
    assert "clock" in get_backend("faulty").knob_database().get("pace").values
