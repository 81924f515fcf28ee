"""int8 quantization of a model ONNX Runtime's pre-processing cannot read: a torch-exported
``nn.TransformerEncoder`` (``dynamo=False``), on which its symbolic shape inference fails with a
bare AssertionError in ``_infer_Reshape``. The failure names the step, where it failed and what
to do; it runs once per search, failures included; the search does not swap in the route
without pre-processing (that is the ``-quant_preprocess=off`` route, measured as such when the
selection names it)."""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import pytest
from conftest import cli, write_tiny_timing

from dossier.backends.interface import BuildError


@pytest.fixture(scope="module")
def encoder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    torch = pytest.importorskip("torch", reason="torch is not installed")
    torch.manual_seed(0)
    layer = torch.nn.TransformerEncoderLayer(d_model=128, nhead=4, dim_feedforward=256,
                                             batch_first=True)
    enc = torch.nn.TransformerEncoder(layer, num_layers=2, enable_nested_tensor=False).eval()
    folder = tmp_path_factory.mktemp("encoder")
    # with gradients on (the exporter's fast path under no_grad has no ONNX form); the
    # exporter's deprecation warnings are not this test's business
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(enc, (torch.randn(2, 16, 128),), str(folder / "model.onnx"),
                          dynamo=False, input_names=["x"], output_names=["y"],
                          dynamic_axes={"x": {0: "batch"}, "y": {0: "batch"}})
    return folder / "model.onnx"


def test_a_failed_pre_processing_names_the_step_and_runs_once(
        encoder: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from onnxruntime.quantization import shape_inference

    from dossier.backends.onnxruntime.precision import preprocessed

    real, calls = shape_inference.quant_pre_process, []

    def counted(*args: object, **kw: object) -> None:
        calls.append(args)
        real(*args, **kw)

    monkeypatch.setattr(shape_inference, "quant_pre_process", counted)
    shared = tmp_path / "scratch"
    reasons = []
    for i in range(3):  # three quantizing builds of one search
        own = tmp_path / f"build-{i}"
        own.mkdir()
        with pytest.raises(BuildError) as exc:
            preprocessed(encoder, own, shared)
        reasons.append(str(exc.value))
    assert len(calls) == 1, "the pre-processing ran again after it failed"
    first = reasons[0]
    assert first.startswith("quant_pre_process (ONNX Runtime's shape inference")
    assert "AssertionError in _infer_Reshape" in first
    assert "add -quant_preprocess=off to the selection" in first
    assert "AssertionError: AssertionError" not in first
    assert all(r.startswith(first) and "failed in an earlier build of this search" in r
               for r in reasons[1:])


def test_a_search_reports_the_failure_once_and_the_route_without_it_competes(
        encoder: Path, tmp_path: Path) -> None:
    folder = encoder.parent
    rng = np.random.default_rng(0)
    inputs = []
    for i in range(3):
        np.save(folder / f"x{i}.npy", rng.standard_normal((2, 16, 128)).astype(np.float32))
        inputs += ["-i", folder / f"x{i}.npy"]
    if not (folder / "validation").exists():
        r = cli("validation", "create", folder / "validation", *inputs, "--model", encoder,
                "--reference", "onnxruntime-cpu")
        assert r.exit_code == 0, r.output
    spec = tmp_path / "release.toml"
    spec.write_text(f"""[release]
name = "encoder"
version = 1

[model]
path = "{encoder}"

[validation]
path = "{folder / 'validation'}"

[tune]
strategy = "full"
selection = "-quantization=[none|dynamic] -quant_per_channel=[off|on] -quant_preprocess=[on|off] -intra_op_num_threads=1"
metric = "cos"
threshold = 0.05
""")
    write_tiny_timing(spec)
    r = cli("tune", spec, "--out", tmp_path / "run", "--json")
    assert r.exit_code == 0, r.output
    from dossier.cache import TuningCache

    trials = TuningCache.open(tmp_path / "run" / "tuning-cache.jsonl").trials
    failed = [t for t in trials if t.outcome.value == "build_failed"]
    assert {t.route for t in failed} == {
        "-intra_op_num_threads=1 -quant_per_channel=off -quant_preprocess=on -quantization=dynamic",
        "-intra_op_num_threads=1 -quant_per_channel=on -quant_preprocess=on -quantization=dynamic"}
    assert all("AssertionError in _infer_Reshape" in (t.reason or "") for t in failed)
    assert sum("failed in an earlier build of this search" in (t.reason or "")
               for t in failed) == 1  # ran once, said twice
    built = [t for t in trials if "-quant_preprocess=off -quantization=dynamic" in t.route]
    assert built and all(t.outcome.value in ("ok", "rejected") for t in built)
