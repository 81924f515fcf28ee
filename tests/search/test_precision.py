"""Precision routes of the ONNX Runtime backend: int8 quantization as transform knobs, the
execution provider knob, and the engines they build (real onnxruntime.quantization runs)."""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path

import numpy as np
import pytest

from dossier.backends import BuildError, get_backend
from dossier.backends.onnxruntime import precision, scratch
from dossier.datasets import load_calibration_set
from dossier.jobs.requests import SCRATCH
from dossier.knobs import KnobPhase
from dossier.routes import Route
from dossier.run_folder import WORK
from dossier.validation import load_validation_set, loss


def _writes_ranges() -> bool:
    """Whether this onnxruntime's quantize_static writes its calibration cache (the ranges)."""
    import inspect

    from onnxruntime.quantization import quantize_static

    return "calibration_cache_path" in inspect.signature(quantize_static).parameters


needs_ranges = pytest.mark.skipif(not _writes_ranges(),
                                  reason="this onnxruntime writes no calibration cache")


@pytest.fixture(scope="module")
def ort_backend():  # type: ignore[no-untyped-def]
    return get_backend("onnxruntime")


def _cos_against_refs(backend, engine: Path, route: Route, vset_path: Path) -> float:  # type: ignore[no-untyped-def]
    runner = backend.load(engine, route)
    worst = 0.0
    for pair in load_validation_set(vset_path).pairs:
        out = runner.run(pair.inputs)
        for name, ref in pair.references.items():
            value = loss("cos", out[name], ref)
            assert value is not None
            worst = max(worst, value)
    return worst


def test_quantization_knobs_are_transform_knobs_that_change_the_numbers(ort_backend) -> None:  # type: ignore[no-untyped-def]
    db = ort_backend.knob_database()
    for name in precision.QUANT_SPEC:
        k = db.get(name)
        assert k.phase is KnobPhase.TRANSFORM and k.changes_numerics
    assert db.get("quantization").values == ("none", "dynamic", "static")
    assert db.get("quantization").default == "none"


def test_knobs_without_effect_are_named_per_route(ort_backend) -> None:  # type: ignore[no-untyped-def]
    db = ort_backend.knob_database()
    none = ort_backend.inert_knobs(Route.parse("-quant_per_channel=on", db), db)
    assert "quant_per_channel" in none and "quantization" not in none
    ov = {precision.OV_PRECISION_KNOB} & set(db.names())  # where OpenVINO runs bf16 here
    dyn = ort_backend.inert_knobs(Route.parse("-quantization=dynamic", db), db)
    assert dyn == {"quant_activation_type", "quant_calibration", *ov}
    assert ort_backend.inert_knobs(Route.parse("-quantization=static", db), db) == ov
    assert ort_backend.needs_calibration(Route.parse("-quantization=static", db), db)
    assert not ort_backend.needs_calibration(Route.parse("-quantization=dynamic", db), db)


def test_openvino_precision_acts_on_openvino_routes_only() -> None:
    """The precision of OpenVINO's floating-point operators is inert on the CPU provider (its
    values there build and time the same engine), and acts on an OpenVINO route, quantized or
    not."""
    assert precision.OV_PRECISION_KNOB in precision.inert({})
    assert precision.OV_PRECISION_KNOB in precision.inert({"execution_provider": "cpu",
                                                           "quantization": "static"})
    for mode in ("none", "dynamic", "static"):
        assert precision.OV_PRECISION_KNOB not in precision.inert(
            {"execution_provider": "openvino", "quantization": mode})


def test_an_openvino_precision_read_back_from_a_bundle_is_checked(samples_dir: Path) -> None:
    """serve parses a bundle's route without a knob database: a crafted precision value stops
    at the load with one line, before any session is made."""
    from dossier.backends import EngineRuntimeError

    backend = get_backend("onnxruntime")
    route = Route.parse("-execution_provider=openvino -openvino_precision=f64")
    with pytest.raises(EngineRuntimeError, match="-openvino_precision=f64: not f32 or bf16"):
        backend.load(samples_dir / "tblock" / "model.onnx", route)


def test_dynamic_int8_changes_the_numbers_within_a_cosine_bar(ort_backend, samples_dir: Path,
                                                              tmp_path: Path) -> None:
    db = ort_backend.knob_database()
    model = samples_dir / "tblock" / "model.onnx"
    route = Route.parse("-quantization=dynamic", db)
    engine = tmp_path / "int8.ort"
    info = ort_backend.build(model, route, engine)
    assert info.facts["quantization"] == "dynamic" and info.facts["format"] == "ort"
    fp32 = tmp_path / "fp32.ort"
    ort_backend.build(model, Route.parse("", db), fp32)
    vset = samples_dir / "tblock" / "validation"
    int8_loss = _cos_against_refs(ort_backend, engine, route, vset)
    fp32_loss = _cos_against_refs(ort_backend, fp32, Route.parse("", db), vset)
    assert fp32_loss < 1e-9 < int8_loss < 1e-3, (fp32_loss, int8_loss)
    doc = json.loads(ort_backend.engine_documents(engine)["quantization.json"])
    assert doc["facts"]["quantization"] == "dynamic" and doc["ranges"] is None
    assert ort_backend.engine_documents(fp32) == {}


def test_static_int8_needs_a_calibration_set_and_records_its_ranges(samples_dir: Path,
                                                                    tmp_path: Path) -> None:
    backend = get_backend("onnxruntime")
    db = backend.knob_database()
    model = samples_dir / "tblock" / "model.onnx"
    route = Route.parse("-quantization=static -quant_calibration=minmax", db)
    with pytest.raises(BuildError, match="needs a calibration set"):
        backend.build(model, route, tmp_path / "no-cal.ort")
    cal = load_calibration_set(samples_dir / "tblock" / "calibration")
    backend.use_calibration(cal)
    info = backend.build(model, route, tmp_path / "static.ort")
    assert info.facts["calibration_digest"] == cal.digest()
    assert info.facts["calibration_samples"] == str(len(cal.samples))
    if not _writes_ranges():
        assert info.facts["calibration_ranges"].startswith("not recorded: onnxruntime")
        return
    assert int(info.facts["calibration_ranges"]) > 0
    doc = json.loads(backend.engine_documents(tmp_path / "static.ort")["quantization.json"])
    assert doc["facts"]["calibration_digest"] == cal.digest() and doc["ranges"]
    # another calibration set gives other ranges: the engine depends on what it was calibrated on
    backend.use_calibration(type(cal)(cal.path, cal.samples[:2]))
    other = backend.build(model, route, tmp_path / "static-2.ort")
    assert other.facts["calibration_ranges_digest"] != info.facts["calibration_ranges_digest"]


@needs_ranges
def test_static_routes_that_differ_in_weights_only_calibrate_once_and_distrust_kept_ranges(
        samples_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    import onnxruntime.quantization  # noqa: F401 - its module quantize, not its function

    qz = sys.modules["onnxruntime.quantization.quantize"]
    calibrations: list[int] = []
    real = qz.create_calibrator

    def counted(*a: object, **k: object) -> object:
        calibrations.append(1)
        return real(*a, **k)

    monkeypatch.setattr(qz, "create_calibrator", counted)
    backend = get_backend("onnxruntime")
    db = backend.knob_database()
    model = samples_dir / "tblock" / "model.onnx"
    backend.use_calibration(load_calibration_set(samples_dir / "tblock" / "calibration"))
    shared = tmp_path / "shared"
    backend.use_build_scratch(shared)

    def build(route: str, name: str) -> dict[str, str]:
        return backend.build(model, Route.parse(route, db), tmp_path / name).facts

    alone = build("-quantization=static", "a.ort")
    per_channel = build("-quantization=static -quant_per_channel=on", "b.ort")
    assert len(calibrations) == 1  # the per-channel route took the per-tensor route's ranges
    assert per_channel["calibration_ranges_digest"] == alone["calibration_ranges_digest"]
    # another calibration choice is another key: calibrated afresh
    signed = build("-quantization=static -quant_activation_type=s8", "c.ort")
    assert len(calibrations) == 2 and signed["calibration_ranges_digest"]
    # kept ranges altered: ignored, calibrated again, and the same ranges come out
    for kept in shared.glob("ranges-*-*.json"):
        kept.write_text(kept.read_text().replace("1", "2", 1))
    again = build("-quantization=static -quant_per_channel=on", "d.ort")
    assert len(calibrations) == 3
    assert again["calibration_ranges_digest"] == alone["calibration_ranges_digest"]
    # a build's copy of the ranges is its own: ONNX Runtime rewrites it when it recalibrates
    pointer = next(q for q in shared.glob("ranges-*.json") if q.stem.count("-") == 1)
    key = pointer.stem.removeprefix("ranges-")
    mine = tmp_path / "mine.json"
    assert scratch.take(shared, "ranges", key, ".json", mine, link=False)
    assert mine.stat().st_nlink == 1
    mine.write_text("{}")
    assert scratch.kept(shared, "ranges", key, ".json") is not None


def test_a_quantizer_failure_is_the_routes_failed_build_with_its_reason(
        ort_backend, samples_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import onnxruntime.quantization as q

    def broken(*_a: object, **_k: object) -> None:
        raise RuntimeError("Unable to find data type for weight_name='w1'")

    monkeypatch.setattr(q, "quantize_dynamic", broken)
    db = ort_backend.knob_database()
    with pytest.raises(BuildError, match="quantize_dynamic: RuntimeError: Unable to find data type"):
        ort_backend.build(samples_dir / "tblock" / "model.onnx",
                          Route.parse("-quantization=dynamic", db), tmp_path / "x.ort")


def test_a_session_that_fell_back_to_the_cpu_provider_is_not_the_route_it_names(
        samples_dir: Path) -> None:
    import onnxruntime as ort

    session = ort.InferenceSession(str(samples_dir / "tblock" / "model.onnx"),
                                   providers=["CPUExecutionProvider"])
    assert precision.provider_problem(session, "CPUExecutionProvider") is None
    why = precision.provider_problem(session, precision.OPENVINO_EP)
    assert why is not None and "fell back to CPUExecutionProvider" in why


def test_the_execution_provider_knob_is_offered_only_where_it_loads(ort_backend) -> None:  # type: ignore[no-untyped-def]
    ov, why = precision.openvino()
    names = ort_backend.knob_database().names()
    if ov is not None:
        assert precision.EP_KNOB in names and precision.EP_KNOB not in ort_backend.knobs_not_offered()
        bf16 = precision.bf16_units() is None
        assert (precision.OV_PRECISION_KNOB in names) is bf16
        assert (precision.OV_PRECISION_KNOB in ort_backend.knobs_not_offered()) is not bf16
    else:
        assert why and precision.EP_KNOB not in names
        assert why in ort_backend.knobs_not_offered()[precision.EP_KNOB]


def test_an_openvino_route_whose_session_falls_back_to_the_cpu_provider_fails_its_build(
        samples_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The built-in path (an onnxruntime with OpenVINO in it) on an onnxruntime without it:
    the knob is offered because the provider is listed, the session is asked for OpenVINO's
    CPU device, and onnxruntime falls back to its CPU provider with only a warning. That
    session is not the route it names: the build fails with that reason."""
    import onnxruntime as ort

    if precision.OPENVINO_EP in ort.get_available_providers():
        pytest.skip("OpenVINO is really reachable here (test_an_openvino_route_runs_on_openvino)")
    listed = ort.get_available_providers()
    monkeypatch.setattr(ort, "get_available_providers", lambda: [precision.OPENVINO_EP, *listed])
    ov, why = precision.openvino()
    assert ov is not None and why is None and not ov.devices and "built in" in ov.source
    backend = get_backend("onnxruntime")
    db = backend.knob_database()
    assert precision.EP_KNOB in db.names()
    with pytest.warns(UserWarning, match="OpenVINOExecutionProvider"), \
            pytest.raises(BuildError, match="fell back to CPUExecutionProvider"):
        backend.build(samples_dir / "tblock" / "model.onnx",
                      Route.parse("-execution_provider=openvino", db), tmp_path / "x.ort")


def test_an_openvino_route_runs_on_openvino(samples_dir: Path, tmp_path: Path) -> None:
    """Where OpenVINO's CPU device is reachable (run in an environment with onnxruntime-openvino
    in place of onnxruntime): the engine is the ONNX model, its session runs on OpenVINO, and
    its outputs match the sample's float64 references within the sample's bar."""
    ov, why = precision.openvino()
    if ov is None:
        pytest.skip(f"no OpenVINO here: {why}")
    backend = get_backend("onnxruntime")
    db = backend.knob_database()
    route = Route.parse("-execution_provider=openvino", db)
    engine = tmp_path / "ov.ort"
    info = backend.build(samples_dir / "tblock" / "model.onnx", route, engine)
    assert info.facts["execution_provider"] == precision.OPENVINO_EP
    assert info.facts["openvino"] == ov.source and info.facts["openvino_nodes"] == "all"
    runner = backend.load(engine, route)
    assert runner._session.get_providers()[0] == precision.OPENVINO_EP
    worst = _cos_against_refs(backend, engine, route, samples_dir / "tblock" / "validation")
    assert worst < 1e-6


def _ov_or_skip() -> precision.OpenVino:
    ov, why = precision.openvino()
    if ov is None:
        pytest.skip(f"no OpenVINO here: {why}")
    return ov


def test_openvino_is_reached_the_same_way_once_the_plug_in_is_registered() -> None:
    """Registering the plug-in makes ONNX Runtime list its provider as available, as a provider
    built in is: the second look must still find the plug-in's devices."""
    first = _ov_or_skip()
    again = precision.openvino()[0]
    assert again is not None and again.source == first.source
    assert len(again.devices) == len(first.devices)


def test_a_bf16_openvino_route_runs_in_bf16_and_the_f32_one_in_f32(
        samples_dir: Path, tmp_path: Path) -> None:
    """OpenVINO's CPU device runs float operators in bf16 by default where the CPU has
    bfloat16 units: the f32 route pins f32 (its outputs those of the CPU provider), the bf16
    route really runs bf16 (a loss in the fifth or sixth digit, within a 1e-3 cosine bar).
    Both are the same engine (the precision is a load-time choice)."""
    _ov_or_skip()
    why = precision.bf16_units()
    if why:
        pytest.skip(why)
    backend = get_backend("onnxruntime")
    db = backend.knob_database()
    model, refs = samples_dir / "tblock" / "model.onnx", samples_dir / "tblock" / "validation"
    f32 = Route.parse("-execution_provider=openvino", db)
    bf16 = Route.parse("-execution_provider=openvino -openvino_precision=bf16", db)
    assert db.get(precision.OV_PRECISION_KNOB).phase is KnobPhase.LOAD
    engine = tmp_path / "ov.ort"
    backend.build(model, f32, engine)
    assert _cos_against_refs(backend, engine, f32, refs) < 1e-9
    assert 1e-8 < _cos_against_refs(backend, engine, bf16, refs) < 1e-3


def test_the_production_load_of_an_openvino_route_runs_on_openvino(
        samples_dir: Path, tmp_path: Path) -> None:
    """The bundle's load snippet for an OpenVINO route makes a session on OpenVINO's CPU
    device with the route's precision pinned (as this host reaches OpenVINO)."""
    _ov_or_skip()
    backend = get_backend("onnxruntime")
    db = backend.knob_database()
    route = Route.parse("-execution_provider=openvino", db)
    engine = tmp_path / "ov.ort"
    backend.build(samples_dir / "tblock" / "model.onnx", route, engine)
    config = backend.production_load(route, db)
    assert precision.OPENVINO_EP in config.call and "INFERENCE_PRECISION_HINT" in str(config.options)
    scope: dict[str, object] = {"ENGINE": str(engine)}
    exec(config.snippet, scope)  # noqa: S102 - the snippet dossier writes into the bundle
    assert scope["session"].get_providers()[0] == precision.OPENVINO_EP  # type: ignore[attr-defined]


def test_the_production_load_of_an_openvino_route_names_the_provider_and_precision(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Without OpenVINO here (the built-in form, as in the fallback test above): the call names
    OpenVINO's provider, not the CPU provider, and the options pin the route's precision."""
    import onnxruntime as ort

    if precision.openvino()[0] is not None:
        pytest.skip("OpenVINO is really reachable here (the test above runs the snippet)")
    listed = ort.get_available_providers()
    monkeypatch.setattr(ort, "get_available_providers", lambda: [precision.OPENVINO_EP, *listed])
    monkeypatch.setattr(precision, "bf16_units", lambda: None)
    backend = get_backend("onnxruntime")
    db = backend.knob_database()
    config = backend.production_load(
        Route.parse("-execution_provider=openvino -openvino_precision=bf16", db), db)
    assert precision.OPENVINO_EP in config.call and "CPUExecutionProvider" not in config.call
    assert json.loads(config.options["load_config"]) == {
        "CPU": {"INFERENCE_PRECISION_HINT": "bf16"}}
    assert config.options["session.load_model_format"] == "ONNX"
    compile(config.snippet, "snippet", "exec")
    cpu = backend.production_load(Route.parse("-execution_provider=cpu", db), db)
    assert "CPUExecutionProvider" in cpu.call and "load_config" not in cpu.options
    # the engine is the ONNX model, compiled where it loads: no ONNX Runtime layout baked in
    assert backend.engine_facts(Route.parse("-execution_provider=openvino", db), db) == {
        "layout_optimized": False, "openvino": True}
    assert backend.engine_facts(Route.parse("-execution_provider=cpu", db), db) == {
        "layout_optimized": True, "openvino": False}


def test_an_openvino_route_with_an_operator_openvino_does_not_run_says_so(tmp_path: Path) -> None:
    """A contrib operator (com.microsoft FastGelu) stays on ONNX Runtime's CPU provider: the
    session's first provider is still OpenVINO, so only the node placement tells; the build
    records it."""
    import onnx
    from onnx import TensorProto, helper

    ov, why = precision.openvino()
    if ov is None:
        pytest.skip(f"no OpenVINO here: {why}")
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8])
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["r"]),
                               helper.make_node("FastGelu", ["r"], ["y"], domain="com.microsoft")],
                              "g", [x], [y])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                    helper.make_opsetid("com.microsoft", 1)])
    model.ir_version = 8
    onnx.save(model, tmp_path / "contrib.onnx")
    backend = get_backend("onnxruntime")
    db = backend.knob_database()
    info = backend.build(tmp_path / "contrib.onnx",
                         Route.parse("-execution_provider=openvino", db), tmp_path / "ov.ort")
    assert info.facts["openvino_nodes"] == "some on the CPU provider"


def test_dossier_knobs_says_why_a_knob_is_not_offered(ort_backend) -> None:  # type: ignore[no-untyped-def]
    from conftest import cli

    r = cli("knobs", "--backend", "onnxruntime", columns=200)
    assert r.exit_code == 0 and "-quantization" in r.stdout
    if ort_backend.knobs_not_offered():
        assert "not offered on this host: -execution_provider=openvino" in r.stdout
    data = json.loads(cli("knobs", "--backend", "onnxruntime", "--json").stdout)
    assert data["not_offered"] == ort_backend.knobs_not_offered()


def test_a_per_channel_dynamic_engine_builds_and_runs_at_another_batch(
        ort_backend, samples_dir: Path, tmp_path: Path) -> None:
    db = ort_backend.knob_database()
    engine = tmp_path / "int8.ort"
    ort_backend.build(samples_dir / "tblock" / "model.onnx",
                      Route.parse("-quantization=dynamic -quant_per_channel=on", db), engine)
    runner = ort_backend.load(engine, Route.parse("-quantization=dynamic", db))
    x = np.random.default_rng(0).standard_normal((2, 32, 128)).astype(np.float32)
    assert runner.run({"x": x})["y"].shape == (2, 32, 128)


def test_routes_that_differ_only_in_knobs_without_effect_are_measured_once(
        sample, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    from dossier.tuner import TuneObserver, tune

    kept: list[list[str]] = []

    class Watch(TuneObserver):  # what the search's build scratch holds after each trial
        def trial_finished(self, record: object) -> None:
            scratch = tmp_path / "run" / WORK / SCRATCH
            kept.append(sorted(p.suffix for p in scratch.glob("preprocessed-*")))

    _, spec = sample("tblock", strategy="full",
                     selection="-quantization=[none|dynamic] -quant_activation_type=[u8|s8] "
                               "-quant_per_channel=[off|on]",
                     metric="cos", threshold=1e-3)
    res = tune(spec, tmp_path / "run", observer=Watch())
    routes = [t.route for t in res.cache.trials if t.role != "confirm"]
    # (none, s8) and (dynamic, s8) build the engines of (none, u8) and (dynamic, u8); a route
    # that does not quantize has no per-channel choice
    assert routes == [
        "-quant_activation_type=u8 -quant_per_channel=off -quantization=none",
        "-quant_activation_type=u8 -quant_per_channel=off -quantization=dynamic",
        "-quant_activation_type=u8 -quant_per_channel=on -quantization=dynamic"]
    # the quantized builds pre-processed the model once and shared it (one model, its pointer
    # and the lock they took turns on, whatever the order of the builds); the finished search
    # leaves no scratch
    assert kept[-1] == [".json", ".lock", ".onnx"], kept
    assert not (tmp_path / "run" / WORK / SCRATCH).exists()
    assert all(t.outcome.value == "ok" for t in res.cache.trials)


def test_quantized_builds_share_one_preprocessed_model_and_distrust_what_is_kept(
        samples_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import onnxruntime.quantization.shape_inference as si

    model = samples_dir / "tblock" / "model.onnx"
    shared = tmp_path / "shared"
    calls: list[str] = []

    def counted(src: str, dst: str, *a: object, **k: object) -> None:  # what is shared is tested
        calls.append(src)
        shutil.copyfile(src, dst)

    monkeypatch.setattr(si, "quant_pre_process", counted)
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    first = precision.preprocessed(model, tmp_path / "a", shared)
    again = precision.preprocessed(model, tmp_path / "b", shared)
    # the second build takes the kept file under a name of its own (ONNX Runtime writes files
    # beside its input: two builds must not write them beside one shared name)
    assert len(calls) == 1 and again.parent == tmp_path / "b"
    assert again.read_bytes() == first.read_bytes()
    [pointer] = shared.glob("preprocessed-*.json")
    [kept] = shared.glob("preprocessed-*-*.onnx")

    # the kept model altered (one byte): not reused, made again
    data = bytearray(kept.read_bytes())
    data[-1] ^= 1
    kept.write_bytes(bytes(data))
    (tmp_path / "c").mkdir()
    made = precision.preprocessed(model, tmp_path / "c", shared)
    assert len(calls) == 2 and made.read_bytes() == first.read_bytes()

    # a pointer naming a file outside the folder, or one that does not parse: ignored
    for bad in ({"file": "../model.onnx", "digest": "0" * 32}, "not json", ["a", "list"]):
        pointer.write_text(json.dumps(bad) if not isinstance(bad, str) else bad)
        (tmp_path / f"d{len(calls)}").mkdir()
        precision.preprocessed(model, tmp_path / f"d{len(calls)}", shared)
    assert len(calls) == 5
    # and the folder restored by the last build is reused again
    (tmp_path / "e").mkdir()
    assert precision.preprocessed(model, tmp_path / "e", shared).parent == tmp_path / "e"
    assert len(calls) == 5


def test_a_quantizer_reads_the_kept_model_under_its_builds_own_name(
        samples_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """ONNX Runtime's quantizers write ``*-inferred.onnx`` beside their input and remove it:
    two builds quantizing one shared name at once failed (FileNotFoundError, three build jobs
    on a BERT-base encoder)."""
    import onnxruntime.quantization as q

    model = samples_dir / "tblock" / "model.onnx"
    shared = tmp_path / "shared"
    (tmp_path / "first").mkdir()
    precision.preprocessed(model, tmp_path / "first", shared)  # kept for the next builds
    inputs: list[Path] = []
    real = q.quantize_dynamic

    def spy(model_input: str, *a: object, **k: object) -> None:
        inputs.append(Path(model_input))
        real(model_input, *a, **k)

    monkeypatch.setattr(q, "quantize_dynamic", spy)
    values = {k[0]: k[2] for k in precision.QUANT_KNOBS} | {"quantization": "dynamic"}
    for i in range(2):
        precision.quantize(model, values, None, tmp_path / f"q{i}.onnx", shared)
    assert len(inputs) == 2 and all(p.parent != shared for p in inputs)  # not the kept file
    assert inputs[0].parent != inputs[1].parent


def test_a_builds_temporary_folders_are_in_the_search_scratch_folder_and_go_after_it(
        samples_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A build killed with SIGKILL cannot remove its temporary folder: made in the search's
    scratch folder (inside the run folder's work folder), it goes with that folder, and the
    kept pre-processed model is on its file system (linked, not copied). A scratch folder that
    is a link is not used: the system's TMPDIR is."""
    import onnxruntime.quantization as q

    seen: list[tuple[Path, Path]] = []
    real = q.quantize_dynamic

    def spy(model_input: str, model_output: str, *a: object, **k: object) -> None:
        seen.append((Path(model_input), Path(model_output)))
        real(model_input, model_output, *a, **k)

    monkeypatch.setattr(q, "quantize_dynamic", spy)
    shared = tmp_path / "run" / ".work" / "scratch"
    backend = get_backend("onnxruntime")
    backend.use_build_scratch(shared)
    route = Route.parse("-quantization=dynamic")
    backend.build(samples_dir / "tblock" / "model.onnx", route, tmp_path / "e.ort")
    [(read, wrote)] = seen
    assert read.parent.parent == shared and read.parent.name.startswith("dossier-quant-")
    assert wrote.parent.parent == shared and wrote.parent.name.startswith("dossier-build-")
    assert not [p for p in shared.iterdir() if p.name.startswith("dossier-")]  # removed after
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    link = tmp_path / "link"
    link.symlink_to(elsewhere, target_is_directory=True)
    assert scratch.folder(link) is None and scratch.folder(shared) == str(shared)


def test_a_lock_that_is_a_link_is_not_followed_and_the_build_goes_on(
        samples_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import onnxruntime.quantization.shape_inference as si

    monkeypatch.setattr(si, "quant_pre_process",
                        lambda src, dst, *a, **k: shutil.copyfile(src, dst))
    model = samples_dir / "tblock" / "model.onnx"
    made = precision.preprocessed(model, tmp_path, tmp_path / "probe")
    [lock] = (tmp_path / "probe").glob("*.lock")
    shared = tmp_path / "shared"
    shared.mkdir()
    target = tmp_path / "elsewhere"
    target.write_text("not to be touched")
    (shared / lock.name).symlink_to(target)
    (tmp_path / "t").mkdir()
    got = precision.preprocessed(model, tmp_path / "t", shared)
    assert got.read_bytes() == made.read_bytes() and target.read_text() == "not to be touched"


def test_a_folder_that_cannot_be_written_leaves_the_build_unshared(
        samples_dir: Path, tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("a file where the folder would be")
    got = precision.preprocessed(samples_dir / "tblock" / "model.onnx", tmp_path, blocker / "x")
    assert got.parent == tmp_path and got.stat().st_size > 0


def _share_in_child(model: str, shared: str, tmp: str, out: str) -> None:
    """One build's pre-processing in a process of its own (quant_pre_process stubbed by a copy:
    the sharing is tested), the file it got written to ``out``."""
    import onnxruntime.quantization.shape_inference as si

    def copy(src: str, dst: str, *a: object, **k: object) -> None:
        with open(Path(shared).parent / "calls", "a") as f:
            f.write(f"{os.getpid()}\n")
        time.sleep(0.2)  # long enough for the others to arrive while it runs
        shutil.copyfile(src, dst)

    si.quant_pre_process = copy
    Path(tmp).mkdir()
    got = precision.preprocessed(Path(model), Path(tmp), Path(shared))
    Path(out).write_text(str(got))


def test_processes_sharing_at_once_take_turns_leave_one_consistent_pair_and_a_fifo_is_not_read(
        samples_dir: Path, tmp_path: Path) -> None:
    import multiprocessing

    model = samples_dir / "tblock" / "model.onnx"
    shared = tmp_path / "shared"
    ctx = multiprocessing.get_context("fork")
    procs = [ctx.Process(target=_share_in_child, args=(str(model), str(shared),
                                                      str(tmp_path / f"t{i}"),
                                                      str(tmp_path / f"out{i}")))
             for i in range(4)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    # they took turns: one pre-processed, the others waited and took its file
    assert len((tmp_path / "calls").read_text().split()) == 1
    got = [Path((tmp_path / f"out{i}").read_text()) for i in range(4)]
    assert [g.parent for g in got] == [tmp_path / f"t{i}" for i in range(4)]
    # whatever order they ran in, the pointer names a kept file whose digest checks
    [pointer] = shared.glob("preprocessed-*.json")
    assert not list(shared.glob(".*.part")) and not list(shared.glob("*.tmp"))
    kept = scratch.kept(shared, "preprocessed", pointer.stem.removeprefix("preprocessed-"), ".onnx")
    assert kept is not None and kept.read_bytes() == model.read_bytes()

    # a FIFO planted under the name the pointer gives: not opened (it would block), made again
    kept.unlink()
    os.mkfifo(kept)
    assert scratch.kept(shared, "preprocessed", pointer.stem.removeprefix("preprocessed-"),
                        ".onnx") is None


def _hold_the_lock(shared: str, key: str, ready: str) -> None:
    with scratch.one_at_a_time(Path(shared), "preprocessed", key):
        Path(ready).write_text("held")
        time.sleep(60)


def test_a_lock_holder_killed_hard_frees_the_lock(tmp_path: Path) -> None:
    import multiprocessing
    import signal

    key = "0" * 32
    ready = tmp_path / "ready"
    holder = multiprocessing.get_context("fork").Process(
        target=_hold_the_lock, args=(str(tmp_path), key, str(ready)))
    holder.start()
    deadline = time.monotonic() + 10
    while not ready.exists() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert ready.exists()
    os.kill(holder.pid or 0, signal.SIGKILL)  # kill -9 while it holds the lock
    holder.join(10)
    t0 = time.monotonic()
    with scratch.one_at_a_time(tmp_path, "preprocessed", key):
        pass
    assert time.monotonic() - t0 < 5


def _keep_under_fsize_limit(made: str, shared: str, limit: int) -> None:
    import resource
    import signal

    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails with EFBIG
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
    scratch.keep(Path(made), Path(shared), "preprocessed", "1" * 32, ".onnx")
    os._exit(0)


def test_a_full_disk_while_keeping_leaves_nothing_half_written(tmp_path: Path) -> None:
    import multiprocessing

    made = tmp_path / "made.onnx"
    made.write_bytes(os.urandom(1 << 20))
    shared = tmp_path / "shared"
    proc = multiprocessing.get_context("fork").Process(
        target=_keep_under_fsize_limit, args=(str(made), str(shared), 64 << 10))
    proc.start()
    proc.join(30)
    assert proc.exitcode == 0  # the build goes on: not kept is not a failure
    assert list(shared.iterdir()) == []  # no part file, no kept file, no pointer
    assert scratch.kept(shared, "preprocessed", "1" * 32, ".onnx") is None
