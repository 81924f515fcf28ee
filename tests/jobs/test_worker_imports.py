"""A trial process imports what its trial needs and no more: ONNX Runtime's knob database is
read without ``onnx`` (its probe model is kept as bytes), so a process given no knob database
(``verify --recheck``'s) does not pay the ~0.5 s import either."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import TINY_TIMING

from dossier.backends import get_backend
from dossier.backends.onnxruntime.knobs import PROBE_MODEL
from dossier.jobs.child import run_child
from dossier.jobs.worker import JudgedResult, WorkerRequest

ROUTE = "-intra_op_num_threads=1"


def test_the_probe_is_the_model_onnx_helper_makes() -> None:
    import onnx
    import onnx.helper as oh

    x = oh.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1, 4])
    y = oh.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1, 4])
    graph = oh.make_graph([oh.make_node("Relu", ["x"], ["y"])], "probe", [x], [y])
    model = oh.make_model(graph, opset_imports=[oh.make_opsetid("", 17)], ir_version=8)
    assert PROBE_MODEL == model.SerializeToString()
    onnx.checker.check_model(onnx.load_from_string(PROBE_MODEL))


def _imported(log: Path) -> set[str]:
    """The modules a process imported, from its ``-X importtime`` lines."""
    return {line.rsplit("|", 1)[-1].strip() for line in log.read_text().splitlines()
            if line.startswith("import time:") and "|" in line}


@pytest.mark.parametrize("given", [True, False], ids=["search-database", "own-database"])
def test_a_trial_process_does_not_import_onnx(sample, tmp_path: Path, given: bool) -> None:
    spec_path, _ = sample("convnet")
    folder = spec_path.parent
    req = WorkerRequest(mode="trial", backend="onnxruntime", model=str(folder / "model.onnx"),
                        validation=str(folder / "validation"), metric="linf", threshold=1e-4,
                        timing=TINY_TIMING, timeout_s=120.0, baseline_route=ROUTE, route=ROUTE,
                        engine=str(tmp_path / "engine.ort"), result=str(tmp_path / "r.json"),
                        stage=str(tmp_path / "stage"),
                        knobs=get_backend("onnxruntime").knob_database() if given else None)
    result = run_child(req, tmp_path, "trial", {"PYTHONPROFILEIMPORTTIME": "1"})
    assert isinstance(result, JudgedResult), result
    imported = _imported(tmp_path / "trial.log")
    assert {"onnxruntime", "dossier.validation"} <= imported  # the log holds the import lines
    assert "onnx" not in imported and not any(m.startswith("onnx.") for m in imported)
