"""dossier validation create / show: a validation set from NumPy files, references computed
independently of the engine under test, provenance recorded; crafted input files (a header
claiming petabytes, a zip bomb, a torn member, an empty batch) refused with one line before
anything large is allocated."""

from __future__ import annotations

import base64
import io
import json
import tracemalloc
import zipfile
from pathlib import Path

import _bundles as h
import numpy as np
import pytest
from conftest import cli

from dossier.errors import ExitCode, ValidationSetError
from dossier.validation import load_validation_set
from dossier_cli.main import app


@pytest.fixture()
def conv(sample) -> Path:
    spec_path, _ = sample("convnet")
    return spec_path


def _inputs_as_numpy(conv: Path, tmp_path: Path) -> list[Path]:
    """The sample's pair inputs as .npz and .npy files (one of each kind)."""
    vset = load_validation_set(conv.parent / "validation")
    files = []
    for i, pair in enumerate(vset.pairs):
        if i % 2:
            f = tmp_path / f"in{i}.npy"
            np.save(f, pair.inputs["x"])
        else:
            f = tmp_path / f"in{i}.npz"
            np.savez(f, **pair.inputs)
        files.append(f)
    return files


def test_create_with_onnxruntime_reference_matches_the_float64_references(
        runner, conv: Path, tmp_path: Path) -> None:
    files = _inputs_as_numpy(conv, tmp_path)
    model = conv.parent / "model.onnx"
    out = tmp_path / "set"
    args = ["validation", "create", str(out), "--reference", "onnxruntime-cpu", "--model",
            str(model)]
    for f in files:
        args += ["--inputs", str(f)]
    r = runner.invoke(app, args)
    assert r.exit_code == 0, r.output
    made = load_validation_set(out)
    sample = load_validation_set(conv.parent / "validation")
    assert [p.name for p in made.pairs] == [p.name for p in sample.pairs]
    for a, b in zip(made.pairs, sample.pairs):
        np.testing.assert_array_equal(a.inputs["x"], b.inputs["x"])
        # the unoptimized ORT run against the sample's float64 numpy reimplementation
        assert np.max(np.abs(a.references["logits"] - b.references["logits"])) < 1e-5
    prov = json.loads((out / "provenance.json").read_text())
    assert prov["reference"] == "onnxruntime-cpu" and "ORT_DISABLE_ALL" in prov["method"]
    assert prov["model"]["xxh3_128"] and len(prov["inputs"]) == len(files)
    # the new set tunes (the dry run checks it against the model)
    spec = conv.read_text().replace('path = "validation"', f'path = "{out}"')
    conv.write_text(spec)
    assert runner.invoke(app, ["tune", str(conv), "--dry-run"]).exit_code == 0
    # show: pairs, shapes, provenance
    r = runner.invoke(app, ["validation", "show", str(out)])
    assert r.exit_code == 0, r.output
    assert "pair-002  references logits float32(8, 10)" in r.stdout
    assert "ORT_DISABLE_ALL" in r.stdout
    data = json.loads(runner.invoke(app, ["validation", "show", str(out), "--json"]).stdout)
    assert data["pairs"][0]["inputs"]["x"] == ["float32", [1, 3, 32, 32]]
    assert data["provenance"]["reference"] == "onnxruntime-cpu"


def test_create_with_a_python_function_keeps_float64(runner, conv: Path, tmp_path: Path,
                                                     monkeypatch) -> None:
    (tmp_path / "myref.py").write_text(
        "import numpy as np\n"
        "def logits(inputs):\n"
        "    x = inputs['x']\n"
        "    assert x.dtype == np.float64\n"
        "    return {'logits': np.tile(x.reshape(x.shape[0], -1)[:, :10], 1)}\n")
    monkeypatch.chdir(tmp_path)
    np.savez(tmp_path / "a.npz", x=np.ones((2, 3, 32, 32), np.float32))
    r = runner.invoke(app, ["validation", "create", "set", "-i", "a.npz", "--reference",
                            "myref:logits", "--model", str(conv.parent / "model.onnx")])
    assert r.exit_code == 0, r.output
    refs = load_validation_set(tmp_path / "set").pairs[0].references
    assert refs["logits"].dtype == np.float64 and refs["logits"].shape == (2, 10)
    prov = json.loads((tmp_path / "set" / "provenance.json").read_text())
    assert prov["reference"] == "myref:logits" and "float64" in prov["method"]


def test_create_from_reference_files(runner, conv: Path, tmp_path: Path) -> None:
    np.savez(tmp_path / "a.npz", x=np.ones((2, 3, 32, 32), np.float32))
    np.save(tmp_path / "r.npy", np.zeros((2, 10), np.float32))
    r = runner.invoke(app, ["validation", "create", str(tmp_path / "set"), "-i",
                            str(tmp_path / "a.npz"), "-r", str(tmp_path / "r.npy"), "--model",
                            str(conv.parent / "model.onnx")])
    assert r.exit_code == 0, r.output
    assert json.loads((tmp_path / "set" / "provenance.json").read_text())["reference"] == "files"


@pytest.mark.parametrize(("text", "message"), [("{", "not valid JSON"),
                                                ('["files"]', "not a JSON object")])
def test_a_damaged_provenance_is_refused(runner, conv: Path, tmp_path: Path, text: str,
                                         message: str) -> None:
    test_create_from_reference_files(runner, conv, tmp_path)
    (tmp_path / "set" / "provenance.json").write_text(text)
    r = runner.invoke(app, ["validation", "show", str(tmp_path / "set")])
    assert r.exit_code == ExitCode.INPUT and message in r.output, r.output


@pytest.mark.parametrize(("make", "extra", "code", "message"), [
    (lambda d: np.save(d / "a.npy", np.ones((2, 3, 31, 32), np.float32)),
     ["--reference", "onnxruntime-cpu"], ExitCode.INPUT,
     "input 'x' has shape (2, 3, 31, 32), model expects ('N', 3, 32, 32)"),
    (lambda d: np.save(d / "a.npy", np.array([{"a": 1}], dtype=object)),
     ["--reference", "onnxruntime-cpu"], ExitCode.INPUT, "not a readable NumPy file"),
    (lambda d: np.save(d / "a.npy", np.ones((2, 3, 32, 32), np.float32)),
     [], ExitCode.INPUT, "give either a references file per inputs file"),
    (lambda d: (np.save(d / "a.npy", np.ones((2, 3, 32, 32), np.float32)),
                np.save(d / "r.npy", np.ones((2, 10), np.float16))),
     ["-r", "r.npy"], ExitCode.INPUT, "less precise than the model output's float32"),
    (lambda d: (np.save(d / "a.npy", np.ones((2, 3, 32, 32), np.float32)),
                np.save(d / "r.npy", np.ones((2, 7), np.float32))),
     ["-r", "r.npy"], ExitCode.INPUT, "reference 'logits' has shape (2, 7)"),
    (lambda d: np.save(d / "a.npy", np.ones((2, 3, 32, 32), np.float32)),
     ["--reference", "no_such_module:fn"], ExitCode.INPUT, "cannot import the reference"),
])
def test_create_refuses_bad_input(runner, conv: Path, tmp_path: Path, monkeypatch, make, extra,
                                  code, message) -> None:
    monkeypatch.chdir(tmp_path)
    make(tmp_path)
    r = runner.invoke(app, ["validation", "create", "set", "-i", "a.npy", "--model",
                            str(conv.parent / "model.onnx"), *extra])
    assert r.exit_code == code, r.output
    assert message in " ".join(r.output.split()), r.output
    assert not (tmp_path / "set").exists()
    assert not [p for p in tmp_path.iterdir() if "staging" in p.name]


def test_create_refuses_an_existing_folder(runner, conv: Path, tmp_path: Path) -> None:
    np.save(tmp_path / "a.npy", np.ones((2, 3, 32, 32), np.float32))
    (tmp_path / "set").mkdir()
    r = runner.invoke(app, ["validation", "create", str(tmp_path / "set"), "-i",
                            str(tmp_path / "a.npy"), "--reference", "onnxruntime-cpu",
                            "--model", str(conv.parent / "model.onnx")])
    assert r.exit_code == ExitCode.OUTPUT and "exists already" in r.output


def _polygraphy_feed(arrays: dict[str, np.ndarray]) -> dict:
    """One feed as Polygraphy's JSON encoder writes it (numpy.save bytes, base64)."""
    import base64
    import io

    out = {}
    for name, arr in arrays.items():
        buf = io.BytesIO()
        np.save(buf, arr, allow_pickle=False)
        out[name] = {"array": base64.b64encode(buf.getvalue()).decode(),
                     "polygraphy_class": "ndarray"}
    return out


def test_create_from_polygraphy_inputs_json(runner, conv: Path, tmp_path: Path) -> None:
    xs = [np.full((n, 3, 32, 32), 0.5, np.float32) for n in (1, 3)]
    f = tmp_path / "inputs.json"
    f.write_text(json.dumps([_polygraphy_feed({"x": x}) for x in xs]))
    r = runner.invoke(app, ["validation", "create", str(tmp_path / "set"), "-i", str(f),
                            "--reference", "onnxruntime-cpu", "--model",
                            str(conv.parent / "model.onnx")])
    assert r.exit_code == 0, r.output
    made = load_validation_set(tmp_path / "set")
    assert [p.inputs["x"].shape[0] for p in made.pairs] == [1, 3]
    np.testing.assert_array_equal(made.pairs[1].inputs["x"], xs[1])
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps([{"x": {"array": "not base64!"}}]))
    r = runner.invoke(app, ["validation", "create", str(tmp_path / "set2"), "-i", str(bad),
                            "--reference", "onnxruntime-cpu", "--model",
                            str(conv.parent / "model.onnx")])
    assert r.exit_code == ExitCode.INPUT and "not a NumPy array" in r.output


def _encoded(arrays: dict[str, object]) -> dict[str, object]:
    """Name -> array as Polygraphy's JSON encoder writes it (numpy.save bytes in base64)."""
    out = {}
    for name, arr in arrays.items():
        buf = io.BytesIO()
        np.save(buf, np.asarray(arr), allow_pickle=False)
        out[name] = {"array": base64.b64encode(buf.getvalue()).decode(),
                     "polygraphy_class": "ndarray"}
    return out


def _run_results(runner: str, outputs: list[dict[str, object]]) -> dict[str, object]:
    """A RunResults JSON (polygraphy run --save-outputs) of one runner."""
    return {"lst": [[runner, [{"outputs": _encoded(o), "runtime": 0.001, "runner_name": runner,
                               "polygraphy_class": "IterationResult"} for o in outputs]]],
            "polygraphy_class": "RunResults"}


def test_validation_create_reads_polygraphy_folders_and_outputs(convnet_folder: Path,
                                                                tmp_path: Path) -> None:
    model = convnet_folder / "model.onnx"
    xs = [np.full((n, 3, 32, 32), 0.25 * n, np.float32) for n in (1, 2, 3)]
    r = cli("validation", "create", tmp_path / "ort", "--model", model, "--reference",
            "onnxruntime-cpu", *[a for i, x in enumerate(xs) for a in
                                 ("-i", _npz(tmp_path / f"x{i}.npz", x=x))])
    assert r.exit_code == 0, r.output
    refs = [p.references for p in load_validation_set(tmp_path / "ort").pairs]
    inputs = tmp_path / "inputs"  # --save-inputs DIR: one file per iteration, 10 after 2
    inputs.mkdir()
    for i, x in zip((0, 2, 10), xs):
        (inputs / f"inputs_{i}.json").write_text(json.dumps([_encoded({"x": x})]))
    outputs = tmp_path / "outputs.json"
    outputs.write_text(json.dumps(_run_results("onnxrt-runner", refs)))
    r = cli("validation", "create", tmp_path / "set", "--model", model, "-i", inputs,
            "-r", outputs)
    assert r.exit_code == 0, r.output
    made = load_validation_set(tmp_path / "set")
    assert [p.inputs["x"].shape[0] for p in made.pairs] == [1, 2, 3]
    for pair, ref in zip(made.pairs, refs):
        np.testing.assert_array_equal(pair.references["logits"], ref["logits"])
    folder = tmp_path / "outputs"  # --save-outputs DIR
    folder.mkdir()
    for i, ref in enumerate(refs):
        (folder / f"outputs_{i}.json").write_text(json.dumps(_run_results("onnxrt-runner", [ref])))
    r = cli("validation", "create", tmp_path / "set2", "--model", model, "-i", inputs,
            "-r", folder)
    assert r.exit_code == 0, r.output
    two = tmp_path / "two.json"
    both = _run_results("trt-runner", refs)
    both["lst"] += _run_results("onnxrt-runner", refs)["lst"]  # type: ignore[operator]
    two.write_text(json.dumps(both))
    r = cli("validation", "create", tmp_path / "set3", "--model", model, "-i", inputs, "-r", two)
    assert r.exit_code == ExitCode.INPUT
    assert "holds the outputs of 2 runners (trt-runner, onnxrt-runner)" in r.output
    r = cli("validation", "create", tmp_path / "set4", "--model", model, "-i", inputs, "-r",
            _npz(tmp_path / "one.npz", logits=refs[0]["logits"]))
    assert r.exit_code == ExitCode.INPUT
    assert "3 pair(s) of inputs but 1 pair(s) of references (from 1 --references" in r.output
    assert not any((tmp_path / f"set{n}").exists() for n in (3, 4))


def _npz(path: Path, **arrays: object) -> Path:
    np.savez(path, **arrays)  # type: ignore[arg-type]
    return path


# --------------------------------------------------------------------- crafted NumPy files
PETA_SHAPE = (2**40, 3, 32, 32)


def _npy_header_only(shape: tuple[int, ...]) -> bytes:
    buf = io.BytesIO()
    np.lib.format.write_array_header_1_0(buf, {"descr": "<f4", "fortran_order": False,
                                               "shape": shape})
    return buf.getvalue()


def _write_npz(path: Path, members: dict[str, bytes]) -> Path:
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as zf:
        for name, data in members.items():
            zf.writestr(name, data)
    return path


@pytest.mark.parametrize("kind", [".npy", ".npz", "polygraphy"])
def test_a_header_claiming_petabytes_is_refused_before_allocation(tmp_path: Path,
                                                                  kind: str) -> None:
    """Before: a 128-byte file whose header claims (2**40, 3, 32, 32) gave a traceback (exit 70)
    while allocating petabytes."""
    from dossier.references import read_pairs

    data = _npy_header_only(PETA_SHAPE)
    if kind == ".npy":
        path = tmp_path / "a.npy"
        path.write_bytes(data)
    elif kind == ".npz":
        path = _write_npz(tmp_path / "a.npz", {"x.npy": data})
    else:
        path = tmp_path / "inputs.json"
        path.write_text(json.dumps([{"x": {"array": base64.b64encode(data).decode(),
                                           "polygraphy_class": "ndarray"}}]))
    with pytest.raises(ValidationSetError, match=r"1099511627776, 3, 32, 32"):
        read_pairs(path, "x")


def test_a_crafted_npy_gets_one_line_from_the_cli(tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    _write_npz(tmp_path / "a.npz", {"x.npy": _npy_header_only(PETA_SHAPE)})
    np.savez(tmp_path / "r.npz", y=np.ones((2, 10), np.float32))
    res = h.cli("validation", "create", "set", "-i", "a.npz", "-r", "r.npz")
    assert res.exit_code == ExitCode.INPUT, h.said(res)
    assert res.stderr.count("\n") == 1 and "needs" in res.stderr
    assert not (tmp_path / "set").exists()


def test_a_zip_bomb_npz_is_refused_before_it_is_unpacked(tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """Before: a 2.1 MB zip-bomb .npz took 4.2 GB of memory before it was refused. Here a
    64 MiB array of zeros (64 KiB deflated) against a cap lowered to 16 MiB: refused from the
    declared sizes, with almost nothing allocated."""
    from dossier import references

    monkeypatch.setattr(references, "MAX_FILE_BYTES", 16 << 20, raising=False)
    path = tmp_path / "bomb.npz"
    np.savez_compressed(path, x=np.zeros((16, 1024, 1024), np.float32))
    assert path.stat().st_size < 1 << 20
    tracemalloc.start()
    try:
        with pytest.raises(ValidationSetError, match="would unpack"):
            references.read_arrays(path)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 4 << 20, peak


def test_a_member_smaller_than_its_header_is_refused(tmp_path: Path) -> None:
    from dossier.references import read_arrays

    full = io.BytesIO()
    np.save(full, np.ones((4, 8), np.float32))
    torn = full.getvalue()[:-16]
    path = _write_npz(tmp_path / "a.npz", {"x.npy": torn})
    with pytest.raises(ValidationSetError, match="the data is"):
        read_arrays(path)


def test_an_empty_batch_gets_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Before: a batch of size 0 gave a pyarrow traceback."""
    monkeypatch.chdir(tmp_path)
    np.savez(tmp_path / "a.npz", x=np.ones((0, 3), np.float32))
    np.savez(tmp_path / "r.npz", y=np.ones((0, 10), np.float32))
    res = h.cli("validation", "create", "set", "-i", "a.npz", "-r", "r.npz")
    assert res.exit_code == ExitCode.INPUT, h.said(res)
    assert res.stderr.count("\n") == 1 and "no element" in res.stderr
    assert not (tmp_path / "set").exists()
