"""The CLI: bad input gets one clear line, a documented exit code, and nothing written."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from conftest import cli, dossier_run, interrupted, tiny_spec, write_tiny_timing

from dossier.errors import ExitCode
from dossier.tensors import write_tensors
from dossier_cli.main import app


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
    (["--threshold", "0"], "--threshold 0.0: Input should be greater than 0"),
    (["--threshold", "-1"], "--threshold -1.0: Input should be greater than 0 (the command "
                            "line overrides tune.threshold"),
    (["--threshold", "inf"], "--threshold inf: Input should be a finite number"),
    (["--threshold", "nan"], "--threshold nan: Input should be a finite number"),
    (["--metric", "l3"], "--metric l3: Input should be 'l0', 'l1', 'l2', 'linf' or 'cos'"),
    (["--strategy", "greedy"], "--strategy greedy: Input should be 'fast', 'mixed', 'full', "
                               "'random' or 'budget'"),
])
def test_bad_tune_input(runner, conv: Path, tmp_path: Path, args: list[str], message: str) -> None:
    out = tmp_path / "run"
    r = _tune(runner, conv, "--out", out, *args)
    assert r.exit_code == ExitCode.INPUT, r.output
    assert message in _one_error_line(r)
    assert not out.exists()


def test_a_knob_not_offered_on_this_host_is_refused_with_the_reason(
        runner, conv: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from dossier.backends.onnxruntime.backend import OnnxRuntimeBackend

    monkeypatch.setattr(OnnxRuntimeBackend, "knobs_not_offered",
                        lambda self: {"no_such_knob": "-no_such_knob=a: needs a thing"})
    out = tmp_path / "run"
    r = _tune(runner, conv, "--out", out, "--selection", "-no_such_knob=[a|b]")
    assert r.exit_code == ExitCode.INPUT, r.output
    assert "not offered on this host: -no_such_knob=a: needs a thing" in _one_error_line(r)
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
    ({"image": np.zeros((2, 3, 32, 32), np.float32)}, None, "inputs lack 'x' of the model's"),
    (None, {"probs": np.zeros((2, 10), np.float32)},
     "references lack 'logits' of the model's outputs ('logits'); every output is compared"),
    (None, {"logits": np.zeros((2, 10)), "probs": np.zeros((2, 10))},
     "references name 'probs', not among the model's outputs"),
    # a reference of the wrong shape, rank or batch is refused before the first build
    (None, {"logits": np.zeros((2, 7), np.float32)}, "reference 'logits' has shape (2, 7), "
                                                     "model expects ('N', 10)"),
    (None, {"logits": np.zeros((2, 10, 1), np.float32)}, "reference 'logits' has rank 3"),
    (None, {"logits": np.zeros((3, 10), np.float32)}, "but dim 'N' is 2 in another tensor"),
    (None, {"logits": np.zeros((2, 10), np.float16)}, "dtype float16, less precise than the "
                                                      "model output's float32"),
    (None, {"logits": np.zeros((2, 10), np.int32)}, "a reference must be floating point"),
    (None, {"logits": np.full((2, 10), np.nan, np.float32)}, "holds NaN or Inf"),
    (None, {"logits": np.full((2, 10), np.inf, np.float32)}, "holds NaN or Inf"),
])
def test_validation_pairs_that_do_not_fit(runner, conv: Path, tmp_path: Path, inputs, refs,
                                          message: str) -> None:
    pair = conv.parent / "validation" / "pair-000"
    if refs is not None and inputs is None:
        inputs = {"x": np.zeros((2, 3, 32, 32), np.float32)}
    if inputs is not None:
        write_tensors(pair / "inputs.arrow", inputs)
    if refs is not None:
        write_tensors(pair / "references.arrow", refs)
    r = _tune(runner, conv, "--out", tmp_path / "run")
    assert r.exit_code == ExitCode.INPUT, r.output
    assert message in _one_error_line(r)
    assert not (tmp_path / "run").exists()
    r = _tune(runner, conv, "--dry-run")  # the dry run checks as much
    assert r.exit_code == ExitCode.INPUT and message in _one_error_line(r)


def _set_shapes(spec: Path, entries: list[dict[str, list[int]]]) -> None:
    text = spec.read_text().split("[[shapes]]")[0]
    for e in entries:
        body = ", ".join(f"{k} = {v}" for k, v in e.items())
        text += f"[[shapes]]\ninputs = {{ {body} }}\n\n"
    spec.write_text(text)


@pytest.mark.parametrize(("entries", "message"), [
    ([{"x": [4, 3, 32, 32]}, {"x": [8, 3, 31, 32]}], "[[shapes]] entry 2: input 'x' has shape "
                                                      "(8, 3, 31, 32), model expects"),
    ([{"x": [4, 5, 32, 32]}], "entry 1: input 'x' has shape (4, 5, 32, 32)"),
    ([{"x": [4, 3, 32]}], "entry 1: input 'x' has rank 3"),
    ([{"x": [4, 3, 32, 32], "y": [4, 2]}], "entry 1: inputs name 'y', not among"),
    ([{"x": [0, 3, 32, 32]}], "every dimension must be at least 1"),
])
def test_shape_entries_checked_against_the_model(runner, conv: Path, tmp_path: Path, entries,
                                                 message: str) -> None:
    _set_shapes(conv, entries)
    r = _tune(runner, conv, "--out", tmp_path / "run")
    assert r.exit_code == ExitCode.INPUT, r.output
    assert message in _one_error_line(r)
    assert not (tmp_path / "run").exists()


def test_shape_entry_missing_one_of_two_inputs(runner, conv: Path, tmp_path: Path) -> None:
    """A two-input model (built here with onnx.helper) and an entry naming one input."""
    import onnx
    from onnx import TensorProto, helper

    a = helper.make_tensor_value_info("a", TensorProto.FLOAT, ["N", 4])
    b = helper.make_tensor_value_info("b", TensorProto.FLOAT, ["N", 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 4])
    graph = helper.make_graph([helper.make_node("Add", ["a", "b"], ["y"])], "add", [a, b], [y])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, str(conv.parent / "model.onnx"))
    vdir = conv.parent / "validation"
    for pair in sorted(vdir.glob("pair-*")):
        write_tensors(pair / "inputs.arrow", {"a": np.ones((2, 4), np.float32),
                                              "b": np.ones((2, 4), np.float32)})
        write_tensors(pair / "references.arrow", {"y": np.full((2, 4), 2.0)})
    text = conv.read_text().replace("-optimizer:NchwcTransformer=[on|off] "
                                    "-optimizer:ConvBNFusion=[on|off]", "")
    conv.write_text(text)
    _set_shapes(conv, [{"a": [2, 4], "b": [2, 4]}])
    assert _tune(runner, conv, "--dry-run").exit_code == 0
    _set_shapes(conv, [{"a": [2, 4]}])
    r = _tune(runner, conv, "--dry-run")
    assert r.exit_code == ExitCode.INPUT
    assert "[[shapes]] entry 1: inputs lack 'b' of the model's inputs ('a', 'b')" in \
        _one_error_line(r)


def test_failed_start_resumes_after_the_validation_set_is_fixed(runner, conv: Path,
                                                                tmp_path: Path) -> None:
    """A baseline that fails accuracy (references of the right shape but wrong values) exits
    4; once the references are fixed, the same run folder starts again (no trial finished
    ok), where a search with a finished trial would refuse the changed set."""
    pair = conv.parent / "validation" / "pair-000"
    good = pair.joinpath("references.arrow").read_bytes()
    from dossier.tensors import read_tensors

    refs = read_tensors(pair / "references.arrow")
    write_tensors(pair / "references.arrow", {k: v + 1.0 for k, v in refs.items()})
    out = tmp_path / "run"
    args = ["--out", out, "--selection", "-intra_op_num_threads=[0|1]", "--strategy", "fast",
            "--quiet"]
    r = _tune(runner, conv, *args)
    assert r.exit_code == ExitCode.TUNE, r.output
    assert "baseline route" in r.output
    pair.joinpath("references.arrow").write_bytes(good)
    r = _tune(runner, conv, "--continue", out, "--quiet")
    assert r.exit_code == 0, r.output
    cache = [json.loads(line) for line in (out / "tuning-cache.jsonl").read_text().splitlines()]
    assert [t["outcome"] for t in cache if t.get("kind") == "trial"][0] == "ok"
    # with a finished trial, a changed validation set is refused
    write_tensors(pair / "references.arrow", {k: v + 1e-3 for k, v in refs.items()})
    r = _tune(runner, conv, "--continue", out, "--quiet")
    assert r.exit_code == ExitCode.INPUT and "validation set changed" in _one_error_line(r)


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


def test_tune_out_that_is_a_file(sample, tmp_path: Path) -> None:
    spec, _ = sample("convnet")
    target = tmp_path / "taken"
    target.write_text("x")
    r = cli("tune", spec, "--out", target)
    assert r.exit_code == ExitCode.OUTPUT, r.output
    assert r.output.strip().startswith("error: --out") and len(r.output.strip().splitlines()) == 1
    assert target.read_text() == "x"


def test_knobs_takes_the_name_as_the_table_prints_it() -> None:
    for name in ("-optimizer:NchwcTransformer", "optimizer:NchwcTransformer"):
        r = cli("knobs", name, "--json")
        assert r.exit_code == 0, r.output
        assert [k["name"] for k in json.loads(r.stdout)["knobs"]] == ["optimizer:NchwcTransformer"]
    r = cli("knobs", "-optimizer:NoSuchThing")
    assert r.exit_code == ExitCode.INPUT and "unknown knob" in r.output


@pytest.mark.parametrize("damage", ["model", "validation", "backend", "shapes", "reference"])
@pytest.mark.parametrize("command", ["release", "tune"])
def test_a_refused_spec_leaves_no_output_folder(convnet_folder: Path, tmp_path: Path,
                                                damage: str, command: str) -> None:
    tune, extra = "", ""
    if damage == "model":
        (convnet_folder / "model.onnx").unlink()
    elif damage == "validation":
        shutil.rmtree(convnet_folder / "validation")
    elif damage == "backend":
        tune = 'backend = "no-such-backend"\nselection = "-a=[x|y]"\n'
    elif damage == "shapes":
        extra = "[[shapes]]\ninputs = { x = [4, 5, 32, 32] }\n"
    else:
        (convnet_folder / "validation" / "pair-001" / "references.arrow").unlink()
    spec = tiny_spec(convnet_folder, tune=tune, extra=extra)
    out = tmp_path / "fresh" / "out"
    r = cli(command, spec, "--out", out)
    assert r.exit_code == ExitCode.INPUT, r.output
    assert not (tmp_path / "fresh").exists(), sorted(str(p) for p in tmp_path.rglob("*"))


@pytest.mark.parametrize(("edit", "message"), [
    (("threshold = 1e-4", "treshold = 1e-4"),
     "tune: unknown key treshold (did you mean threshold?)"),
    (("[tune]", "[tunes]"), "unknown table [tunes] (did you mean [tune]?)"),
    (("samples = 12", "sample = 12"), "timing: unknown key sample (did you mean samples?)"),
    (("[release]", "[bogus]\n[release]"), "unknown table [bogus] (known: release, model"),
])
def test_spec_typos_are_named(convnet_folder: Path, edit: tuple[str, str], message: str) -> None:
    spec = tiny_spec(convnet_folder)
    spec.write_text(spec.read_text().replace(*edit, 1))
    r = cli("tune", spec, "--dry-run")
    assert r.exit_code == ExitCode.INPUT, r.output
    assert message in r.output and "Field required" not in r.output


def test_shape_entries_are_numbered_from_one_in_every_message(convnet_folder: Path) -> None:
    ok = "[[shapes]]\ninputs = { x = [1, 3, 32, 32] }\n"
    r = cli("tune", tiny_spec(convnet_folder, extra=ok + "[[shapes]]\nweight = -1\ninputs = "
                                                         "{ x = [1, 3, 32, 32] }\n"), "--dry-run")
    assert r.exit_code == ExitCode.INPUT and "[[shapes]] entry 2: weight:" in r.output
    r = cli("tune", tiny_spec(convnet_folder, extra=ok + "[[shapes]]\nwieght = 1\ninputs = "
                                                         "{ x = [1, 3, 32, 32] }\n"), "--dry-run")
    assert "[[shapes]] entry 2: unknown key wieght (did you mean weight?)" in r.output
    r = cli("tune", tiny_spec(convnet_folder, extra=ok + "[[shapes]]\ninputs = "
                                                         "{ x = [1, 5, 32, 32] }\n"),
            "--dry-run")  # checked against the model, by the search
    assert r.exit_code == ExitCode.INPUT and "[[shapes]] entry 2: input 'x'" in r.output


def test_interrupted_tune_names_the_command_that_resumes_it(convnet_folder: Path,
                                                            tmp_path: Path) -> None:
    selection = ('selection = "-graph_optimization_level=[all|basic|disable_all] '
                 '-optimizer:NchwcTransformer=[on|off] -optimizer:ConvBNFusion=[on|off]"\n'
                 'strategy = "full"\n')
    spec = tiny_spec(convnet_folder, tune=selection)
    run = tmp_path / "run"
    rc, err = interrupted("tune", spec, "--out", run, after="[  1] ", cwd=tmp_path)
    assert rc == ExitCode.INTERRUPTED, err
    line = err.strip().splitlines()[-1]
    assert line == (f"interrupted; finished trials are kept in {run}: resume with dossier tune "
                    f"--continue {run}"), err
    again = dossier_run(*line.split("resume with dossier ", 1)[1].split(), cwd=tmp_path)
    assert again.returncode == 0, again.stderr
    assert "restored" in again.stderr and again.stdout.startswith(f"run: {run}\n")
