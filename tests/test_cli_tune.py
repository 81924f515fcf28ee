"""The CLI: bad input gets one clear line, a documented exit code, and nothing written."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from cli.main import app
from dossier.errors import ExitCode
from dossier.tensors import write_tensors
from tests.conftest import write_tiny_timing


def _tune(runner, *args: str):
    return runner.invoke(app, ["tune", *map(str, args)])


def _one_error_line(result) -> str:
    lines = [ln for ln in result.output.splitlines() if ln.strip()]
    text = " ".join(lines)
    assert text.startswith("error:"), result.output
    return text


@pytest.fixture()
def conv(sample):
    spec_path, _ = sample("convnet")
    write_tiny_timing(spec_path)
    return spec_path


def test_dry_run_json_lists_routes_in_trtexec_order(runner, conv: Path) -> None:
    r = _tune(runner, conv, "--dry-run", "--json")
    assert r.exit_code == 0, r.output
    data = json.loads(r.stdout)
    assert data["count"] == len(data["routes"]) == 3 * 2 * 2
    assert data["routes"][0] == data["baseline"]
    # the last knob of the selection (ConvBNFusion) changes fastest
    assert data["routes"][1].endswith("-optimizer:ConvBNFusion=off -optimizer:NchwcTransformer=on")
    assert data["routes"][2].endswith("-optimizer:ConvBNFusion=on -optimizer:NchwcTransformer=off")
    assert "level=disable_all" in data["routes"][11] and "level=basic" in data["routes"][4]
    fast = json.loads(_tune(runner, conv, "--dry-run", "--json", "--strategy", "fast").stdout)
    assert fast["count"] == 1 + 2 + 1 + 1


def test_dry_run_text_and_mixed_refusal(runner, conv: Path) -> None:
    r = _tune(runner, conv, "--dry-run")
    assert r.exit_code == 0 and r.stdout.splitlines()[0].startswith("[0]:-graph_optimization_level=all")
    r = _tune(runner, conv, "--dry-run", "--strategy", "mixed")
    assert r.exit_code == ExitCode.INPUT and "depends on measured results" in r.output


@pytest.mark.parametrize(("args", "message"), [
    (["--selection", "-no_such_knob=[a|b]"], "unknown knob -no_such_knob"),
    (["--selection", "-graph_optimization_level=[all|fastest]"], "value 'fastest' is not allowed"),
    (["--selection", "-intra_op_num_threads=[1|1]"], "listed twice"),
    (["--selection", "-intra_op_num_threads=[1|2] -intra_op_num_threads=4"], "appears twice"),
    (["--selection", " "], "the selection is empty"),
    (["--threshold", "0"], "tune.threshold"),
    (["--threshold", "-1"], "tune.threshold"),
    (["--metric", "l3"], "tune.metric 'l3'"),
    (["--strategy", "random"], "unknown strategy 'random'"),
])
def test_bad_tune_input(runner, conv: Path, tmp_path: Path, args: list[str], message: str) -> None:
    out = tmp_path / "run"
    r = _tune(runner, conv, "--out", out, *args)
    assert r.exit_code == ExitCode.INPUT, r.output
    assert message in _one_error_line(r)
    assert not out.exists()


def test_missing_and_malformed_model(runner, conv: Path, tmp_path: Path) -> None:
    model = conv.parent / "model.onnx"
    model.rename(conv.parent / "elsewhere.onnx")
    r = _tune(runner, conv, "--out", tmp_path / "a")
    assert r.exit_code == ExitCode.INPUT and "does not exist" in _one_error_line(r)
    model.write_bytes(b"this is not onnx")
    r = _tune(runner, conv, "--out", tmp_path / "b")
    assert r.exit_code == ExitCode.INPUT and "not a readable ONNX file" in _one_error_line(r)
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()


@pytest.mark.parametrize(("inputs", "refs", "message"), [
    ({"x": np.zeros((2, 3, 16, 16), np.float32)}, None, "input 'x' has shape (2, 3, 16, 16)"),
    ({"x": np.zeros((2, 3, 32, 32), np.float64)}, None, "input 'x' has dtype float64"),
    ({"image": np.zeros((2, 3, 32, 32), np.float32)}, None, "do not match the model"),
    (None, {"probs": np.zeros((2, 10), np.float32)}, "do not match the model's outputs"),
    (None, {"logits": np.full((2, 10), np.nan, np.float32)}, "holds NaN or Inf"),
    (None, {"logits": np.full((2, 10), np.inf, np.float32)}, "holds NaN or Inf"),
])
def test_validation_pairs_that_do_not_fit(runner, conv: Path, tmp_path: Path, inputs, refs,
                                          message: str) -> None:
    pair = conv.parent / "validation" / "pair-000"
    if inputs is not None:
        write_tensors(pair / "inputs.arrow", inputs)
    if refs is not None:
        write_tensors(pair / "references.arrow", refs)
    r = _tune(runner, conv, "--out", tmp_path / "run")
    assert r.exit_code == ExitCode.INPUT, r.output
    assert message in _one_error_line(r)
    assert not (tmp_path / "run").exists()


def test_unwritable_output(runner, conv: Path, tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    r = _tune(runner, conv, "--out", blocker / "run", "--selection", "-intra_op_num_threads=[0|1]")
    assert r.exit_code == ExitCode.OUTPUT, r.output
    assert "cannot write" in _one_error_line(r)


def test_tune_json_and_continue(runner, conv: Path, tmp_path: Path) -> None:
    out = tmp_path / "run"
    r = _tune(runner, conv, "--out", out, "--selection", "-intra_op_num_threads=[0|1]",
              "--strategy", "fast", "--json", "--quiet")
    assert r.exit_code == 0, r.output
    data = json.loads(r.stdout)
    assert data["trials"] >= 2 and data["decision"]["shipped_route"]
    again = _tune(runner, "--continue", out / "tuning-cache.jsonl", "--json", "--quiet")
    assert again.exit_code == 0, again.output
    assert json.loads(again.stdout)["trials_run"] == 0
    r = _tune(runner, "--continue", out, "--selection", "-intra_op_num_threads=[0|2]")
    assert r.exit_code == ExitCode.USAGE


def test_knobs_command(runner) -> None:
    r = runner.invoke(app, ["knobs", "--json"])
    assert r.exit_code == 0
    data = json.loads(r.stdout)
    names = [k["name"] for k in data["knobs"]]
    assert "graph_optimization_level" in names and "optimizer:NchwcTransformer" in names
    r = runner.invoke(app, ["knobs", "optimizer:GeluFusion"])
    assert r.exit_code == ExitCode.INPUT and "did you mean" in r.output
    r = runner.invoke(app, ["knobs", "--backend", "nope"])
    assert r.exit_code == ExitCode.INPUT and "unknown backend" in r.output
