"""The ONNX Runtime backend: knob database, build/load fidelity, knobs that must take effect."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest

from dossier.backends import get_backend
from dossier.backends.onnxruntime import REWRITE_RULES, registered_transformers
from dossier.errors import ModelError, SelectionError
from dossier.routes import Route, Selection
from dossier.validation import load_validation_set

ORT = get_backend("onnxruntime")


def test_knob_database_offers_only_registered_optimizer_names() -> None:
    db = ORT.knob_database()
    registered = set(registered_transformers())
    assert {"NchwcTransformer", "GeluFusionL2", "LayerNormFusionL1"} <= registered
    for knob in db.knobs:
        if knob.name.startswith("optimizer:"):
            name = knob.name.split(":", 1)[1]
            assert name in registered or name in REWRITE_RULES, name
    # the misspellings ORT would silently accept are refused here
    for wrong in ("-optimizer:GeluFusion=[on|off]", "-optimizer:NchwcTransformers=off"):
        with pytest.raises(SelectionError, match="unknown knob"):
            Selection.parse(wrong, db)


def test_digest_is_stable_and_knob_sensitive() -> None:
    db = ORT.knob_database()
    assert db.digest() == ORT.knob_database().digest()
    changed = db.model_copy(update={"knobs": db.knobs[1:]})
    assert changed.digest() != db.digest()


@pytest.mark.parametrize("route", [
    "",
    "-graph_optimization_level=disable_all",
    "-graph_optimization_level=basic -optimizer:ConvBNFusion=off",
    "-optimizer:NchwcTransformer=off -intra_op_num_threads=1",
    "-execution_mode=parallel -inter_op_num_threads=2 -enable_mem_pattern=off",
])
def test_loaded_engine_reproduces_live_session_bit_for_bit(samples_dir: Path, tmp_path: Path,
                                                          route: str) -> None:
    model = samples_dir / "convnet" / "model.onnx"
    vset = load_validation_set(samples_dir / "convnet" / "validation")
    r = Route.parse(route, ORT.knob_database())
    ORT.build(model, r, tmp_path / "e.ort")
    assert (tmp_path / "e.ort").read_bytes()[4:8] == b"ORTM"
    loaded, live = ORT.load(tmp_path / "e.ort", r), ORT.live(model, r)
    for pair in vset.pairs:
        a, b = loaded.run(pair.inputs), live.run(pair.inputs)
        assert a.keys() == b.keys()
        for k in a:
            assert np.array_equal(a[k], b[k]), (route, pair.name, k)
            assert np.max(np.abs(a[k] - pair.references[k])) < 1e-4


def test_gelu_approximation_is_baked_into_the_engine(samples_dir: Path, tmp_path: Path) -> None:
    model = samples_dir / "tblock" / "model.onnx"
    db = ORT.knob_database()
    ORT.build(model, Route.parse("-gelu_approximation=on", db), tmp_path / "approx.ort")
    ORT.build(model, Route.parse("", db), tmp_path / "exact.ort")
    vset = load_validation_set(samples_dir / "tblock" / "validation")
    pair = vset.pairs[0]
    exact = ORT.load(tmp_path / "exact.ort", Route.of({})).run(pair.inputs)["y"]
    approx = ORT.load(tmp_path / "approx.ort", Route.of({})).run(pair.inputs)["y"]
    ref = pair.references["y"]
    assert np.max(np.abs(exact - ref)) < 1e-5 < 1e-4 < np.max(np.abs(approx - ref))


def test_optimizer_without_effect_on_the_model_is_refused(samples_dir: Path) -> None:
    db = ORT.knob_database()
    conv = samples_dir / "convnet" / "model.onnx"
    ORT.check_route(conv, Route.parse("-optimizer:NchwcTransformer=off -optimizer:ConvBNFusion=off"), db)
    with pytest.raises(SelectionError, match="GeluFusionL2=off does not change"):
        ORT.check_route(conv, Route.parse("-optimizer:GeluFusionL2=off"), db)


def test_signature_and_malformed_models(samples_dir: Path, tmp_path: Path) -> None:
    sig = ORT.signature(samples_dir / "convnet" / "model.onnx")
    assert [(t.name, t.dtype, t.shape) for t in sig.inputs] == [("x", "float32", ("N", 3, 32, 32))]
    assert [t.name for t in sig.outputs] == ["logits"]
    with pytest.raises(ModelError, match="does not exist"):
        ORT.signature(tmp_path / "missing.onnx")
    (tmp_path / "junk.onnx").write_bytes(b"\x00\x01garbage" * 100)
    with pytest.raises(ModelError):
        ORT.signature(tmp_path / "junk.onnx")
    empty = onnx.helper.make_model(onnx.helper.make_graph([], "g", [], []))
    onnx.save(empty, tmp_path / "empty.onnx")
    with pytest.raises(ModelError, match="no outputs"):
        ORT.signature(tmp_path / "empty.onnx")


def test_load_time_knobs_apply_at_load_and_build_knobs_at_build() -> None:
    from dossier.knobs import KnobPhase

    r = Route.parse("-intra_op_num_threads=1 -graph_optimization_level=basic -enable_mem_pattern=off")
    build, _ = ORT._options(r, KnobPhase.BUILD)
    load, _ = ORT._options(r, KnobPhase.LOAD)
    assert build.intra_op_num_threads == 0 and build.enable_mem_pattern
    assert load.intra_op_num_threads == 1 and not load.enable_mem_pattern
    assert str(build.graph_optimization_level).endswith("ENABLE_BASIC")
    assert str(load.graph_optimization_level).endswith("ENABLE_ALL")  # load() then disables all
