"""The three data sets, round 2: overlap found by value and row by row, bad values refused
before the first build, and a split that refuses what it cannot do, keeps copies together and
says where its sets came from."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from conftest import cli, tiny_spec, write_tiny_timing

from dossier.datasets import CalibrationSet, check_apart, check_sets, row_digests, split
from dossier.errors import InputError, ValidationSetError
from dossier.tensors import write_tensors
from dossier.validation import Pair, ValidationSet, load_validation_set


def _vset(*inputs: np.ndarray, name: str = "val") -> ValidationSet:
    return ValidationSet(Path(name), tuple(
        Pair(f"pair-{i:03d}", {"x": x}, {"y": np.zeros(1, np.float32)})
        for i, x in enumerate(inputs)))


def _cal(*inputs: np.ndarray) -> CalibrationSet:
    return CalibrationSet(Path("cal"), tuple((f"sample-{i:03d}", {"x": x})
                                             for i, x in enumerate(inputs)))


RNG = np.random.default_rng(11)
V = [RNG.standard_normal((1, 6)).astype(np.float32) for _ in range(4)]
"""Four validation inputs of batch 1."""
OTHER = RNG.standard_normal((2, 6)).astype(np.float32)
"""A batch of two rows no other set holds."""


@pytest.mark.parametrize("case", ["concatenated", "batched-with", "reordered", "sliced"])
def test_overlap_is_found_row_by_row_along_the_batch(case: str) -> None:
    val = _vset(*V)
    batch4 = np.concatenate(V)
    cal, hold = None, None
    if case == "concatenated":  # a calibration batch of every validation input
        cal = _cal(batch4)
        want = "calibration sample sample-000 row 0 = validation pair pair-000"
    elif case == "batched-with":  # a hold-out pair whose batch holds a validation input
        hold = _vset(np.concatenate([OTHER, V[2]]), name="hold")
        want = "hold-out pair pair-000 row 2 = validation pair pair-002"
    elif case == "reordered":  # a validation batch, reordered, as a hold-out pair
        val = _vset(batch4)
        hold = _vset(batch4[::-1].copy(), name="hold")
        want = "hold-out pair pair-000 row 0 = validation pair pair-000 row 3"
    else:  # a slice of a validation batch as calibration
        val = _vset(batch4)
        cal = _cal(batch4[1:3].copy())
        want = "calibration sample sample-000 row 0 = validation pair pair-000 row 1"
    with pytest.raises(ValidationSetError, match="the data sets overlap") as exc:
        check_apart(val, cal, hold)
    assert want in str(exc.value), exc.value


def test_overlap_is_found_by_value_sign_of_zero_and_the_models_dtype() -> None:
    z = np.array([[0.0, 1.5, -2.0]], np.float32)
    val = _vset(z)
    check_apart(val, _cal(z + 1), None)  # other values: apart
    negzero = z.copy()
    negzero[0, 0] = -0.0
    assert negzero.tobytes() != z.tobytes()
    with pytest.raises(ValidationSetError, match="calibration sample sample-000 = validation "
                                                 "pair pair-000"):
        check_apart(val, _cal(negzero), None)
    # 0.1 in float64 is not 0.1 in float32, but the model reads float32: the same input
    tenth = np.array([[0.1, 0.2, 0.3]])
    val32 = _vset(tenth.astype(np.float32))
    check_apart(val32, None, _vset(tenth, name="hold"))  # without the model's dtype: apart
    with pytest.raises(ValidationSetError, match="hold-out pair pair-000 = validation pair"):
        check_apart(val32, None, _vset(tenth, name="hold"), {"x": "float32"})
    ints = _vset(np.array([[3, 1, 2]], np.int64))
    with pytest.raises(ValidationSetError, match="overlap"):
        check_apart(ints, None, _vset(np.array([[3, 1, 2]], np.int32), name="hold"),
                    {"x": "int64"})


def test_row_digests_are_one_per_row_and_the_sample_without_a_batch() -> None:
    b = np.concatenate(V)
    assert row_digests({"x": b}) == [row_digests({"x": v})[0] for v in V]
    # inputs that disagree on their first dimension: the sample is one row
    assert len(row_digests({"x": b, "m": np.ones((3, 2))})) == 1
    assert len(row_digests({"s": np.float32(2.0)})) == 1


@pytest.mark.parametrize("role, where", [("validation", "validation pair pair-001"),
                                         ("holdout", "hold-out pair pair-000"),
                                         ("calibration", "calibration sample sample-000")])
def test_nan_or_inf_in_any_input_is_named_by_set_pair_and_input(role: str, where: str) -> None:
    bad = V[1].copy()
    bad[0, 3] = np.inf if role == "holdout" else np.nan
    val = _vset(V[0], bad) if role == "validation" else _vset(V[0], V[1])
    hold = _vset(bad, name="hold") if role == "holdout" else None
    cal = _cal(bad) if role == "calibration" else None
    with pytest.raises(ValidationSetError, match=f"{where}: input 'x' holds NaN or Inf"):
        check_sets(val, cal, hold)


def _tblock(samples_dir: Path, tmp_path: Path) -> Path:
    folder = tmp_path / "tblock"
    shutil.copytree(samples_dir / "tblock", folder)
    write_tiny_timing(folder / "release-int8.toml")
    return folder


def _refused_before_any_build(folder: Path, tmp_path: Path, message: str) -> None:
    r = cli("tune", folder / "release-int8.toml", "--out", tmp_path / "run")
    assert r.exit_code == 3, r.output
    assert message in r.stderr and len(r.stderr.strip().splitlines()) <= 2, r.stderr
    assert not (tmp_path / "run").exists() or not any((tmp_path / "run").iterdir())


@pytest.mark.parametrize("role, folder_name, message", [
    ("holdout", "holdout/pair-000", "hold-out pair pair-000: input 'x' holds NaN or Inf"),
    ("validation", "validation/pair-001", "validation pair pair-001: input 'x' holds NaN or Inf"),
])
def test_a_search_refuses_nan_inputs_before_its_first_build(
        samples_dir: Path, tmp_path: Path, role: str, folder_name: str, message: str) -> None:
    folder = _tblock(samples_dir, tmp_path)
    f = folder / folder_name / "inputs.arrow"
    x = load_validation_set(folder / role).pairs[0 if role == "holdout" else 1].inputs["x"].copy()
    x.flat[5] = np.nan
    write_tensors(f, {"x": x})
    _refused_before_any_build(folder, tmp_path, message)


def test_a_calibration_batch_of_validation_inputs_is_refused(samples_dir: Path,
                                                             tmp_path: Path) -> None:
    folder = _tblock(samples_dir, tmp_path)
    val = load_validation_set(folder / "validation")
    rows = np.concatenate([p.inputs["x"] for p in val.pairs[:2]])
    write_tensors(folder / "calibration" / "sample-000" / "inputs.arrow", {"x": rows})
    _refused_before_any_build(folder, tmp_path, "calibration sample sample-000 row 0 = "
                                                "validation pair pair-000")


# ----------------------------------------------------------------------------- split


def _source(tmp_path: Path, xs: list[np.ndarray]) -> Path:
    src = tmp_path / "all"
    for i, x in enumerate(xs):
        pair = src / f"pair-{i:03d}"
        pair.mkdir(parents=True)
        write_tensors(pair / "inputs.arrow", {"x": x})
        write_tensors(pair / "references.arrow", {"y": x * 2})
    (src / "provenance.json").write_text(json.dumps({
        "method": "the model run by ONNX Runtime", "reference": "onnxruntime-cpu",
        "tool": "dossier validation create",
        "pairs": [{"name": f"pair-{i:03d}"} for i in range(len(xs))],
        "inputs": [{"path": "a.npz"}]}))
    return src


@pytest.mark.parametrize("flags, message", [
    (["--holdout", "nan"], "--holdout nan"),
    (["--holdout", "inf"], "--holdout inf"),
    (["--calibration", "-inf"], "--calibration"),
    (["--seed", "-1"], "--seed -1"),
    (["--holdout", "0.01"], "--holdout 0.01 of 10 pair(s) rounds to no pair"),
])
def test_split_refuses_what_it_cannot_do_in_one_line(tmp_path: Path, flags: list[str],
                                                     message: str) -> None:
    rng = np.random.default_rng(0)
    src = _source(tmp_path, [rng.standard_normal((1, 3)).astype(np.float32)
                             for _ in range(10)])
    r = cli("validation", "split", src, "--out", tmp_path / "out", *flags)
    assert r.exit_code in (2, 3), r.output
    assert message in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert not (tmp_path / "out").exists()


def test_split_keeps_copies_of_one_input_together_whatever_the_seed(tmp_path: Path) -> None:
    rng = np.random.default_rng(1)
    xs = [rng.standard_normal((1, 3)).astype(np.float32) for _ in range(8)]
    xs[5] = xs[1].copy()  # a duplicate
    xs[7] = -0.0 + np.concatenate([xs[3], xs[6]])  # a batch of two others
    src = _source(tmp_path, xs)
    for seed in range(6):
        r = split(src, tmp_path / f"out{seed}", holdout=0.3, calibration=1, seed=seed)
        where = {n: role for role in ("validation", "holdout", "calibration")
                 for n in getattr(r, role)}
        assert where["pair-001"] == where["pair-005"], (seed, where)
        assert where["pair-003"] == where["pair-006"] == where["pair-007"], (seed, where)
        assert sorted(map(sorted, r.kept_together)) == [["pair-001", "pair-005"],
                                                        ["pair-003", "pair-006", "pair-007"]]
        from dossier.datasets import load_calibration_set

        cal_dir = tmp_path / f"out{seed}" / "calibration"
        check_apart(load_validation_set(tmp_path / f"out{seed}" / "validation"),
                    load_calibration_set(cal_dir) if cal_dir.exists() else None,
                    load_validation_set(tmp_path / f"out{seed}" / "holdout"))


def test_split_records_its_seed_and_source_and_drops_a_stale_provenance(tmp_path: Path) -> None:
    rng = np.random.default_rng(2)
    src = _source(tmp_path, [rng.standard_normal((1, 3)).astype(np.float32) for _ in range(6)])
    split(src, tmp_path / "out", holdout=2, calibration=0, seed=9)
    source_digest = load_validation_set(src).digest()
    for role, n in (("validation", 4), ("holdout", 2)):
        prov = load_validation_set(tmp_path / "out" / role).provenance
        assert prov["reference"] == "onnxruntime-cpu"  # how the references were made: kept
        assert "pairs" not in prov and "inputs" not in prov  # the source's files: not copied
        s = prov["split"]
        assert isinstance(s, dict)
        assert (s["seed"], s["role"], s["source"]["digest"]) == (9, role, source_digest)
        assert len(s["from"]) == n
    assert not (tmp_path / "out" / "calibration").exists()
    # no hold-out share asked for: no empty hold-out folder either
    split(src, tmp_path / "none", holdout=0, calibration=0, seed=1)
    assert not (tmp_path / "none" / "holdout").exists()
    with pytest.raises(InputError, match="rounds to no pair"):
        split(src, tmp_path / "tiny", holdout=0.05, calibration=0, seed=1)


# ------------------------------------------------------------------------- threshold


def _refs(y: np.ndarray) -> ValidationSet:
    return ValidationSet(Path("v"), (Pair("pair-000", {"x": np.ones(2)}, {"y": y}),))


CENTRED = np.random.default_rng(5).standard_normal((64, 64)).astype(np.float32)


@pytest.mark.parametrize("metric, threshold, said", [
    ("cos", 0.9, "cosine similarity of 0.1 pass"),
    ("cos", 0.5, "cosine similarity of 0.5 pass"),
    ("l0", 0.6, "60% of their elements wrong"),
    ("linf", 1e9, "all-zero output"),
    ("l1", 1e3, "all-zero output"),
    ("l2", 1e3, "all-zero output"),
])
def test_a_threshold_that_switches_the_check_off_is_warned_for_every_metric(
        caplog: pytest.LogCaptureFixture, metric: str, threshold: float, said: str) -> None:
    import logging

    from dossier.threshold import check_threshold

    with caplog.at_level(logging.WARNING, logger="dossier.threshold"):
        check_threshold(metric, 1e-3, _refs(CENTRED))
        assert not caplog.records
        check_threshold(metric, threshold, _refs(CENTRED))
    assert said in caplog.text and "switches the check off" in caplog.text, caplog.text


def test_a_cos_threshold_above_a_constant_outputs_loss_is_warned(
        caplog: pytest.LogCaptureFixture) -> None:
    """cos is scale-free: on all-positive references a constant output is nearly right, and a
    threshold above its loss lets a constant engine through."""
    import logging

    from dossier.threshold import check_threshold, zero_output_loss
    from dossier.validation import loss

    positive = np.abs(CENTRED) + 1.0
    const = zero_output_loss("cos", _refs(positive))
    assert const == pytest.approx(loss("cos", np.ones_like(positive), positive))
    assert const is not None and 0 < const < 0.2
    with caplog.at_level(logging.WARNING, logger="dossier.threshold"):
        check_threshold("cos", const * 2, _refs(positive))
    assert "a constant output" in caplog.text


# ---------------------------------------------------------------- what a new user trips on
THREADS = 'selection = "-intra_op_num_threads=[1|2]"\n'


def test_an_unknown_tune_key_that_names_knobs_says_they_are_knobs(tmp_path: Path) -> None:
    r = cli("tune", tiny_spec(tmp_path, tune=THREADS + "threads = 2\n"), "--out", tmp_path / "run")
    assert r.exit_code == 3, r.output
    line = r.stderr.strip()
    assert "threads is not a [tune] key" in line and "-intra_op_num_threads" in line, line
    assert "threshold" not in line and len(line.splitlines()) == 1, line
    # a misspelt [tune] key still gets its suggestion
    r = cli("tune", tiny_spec(tmp_path, tune=THREADS + "treshold = 2\n"), "--out",
            tmp_path / "run")
    assert r.exit_code == 3 and "did you mean threshold" in r.stderr, r.output


def test_a_model_path_naming_a_folder_says_it_is_a_folder(tmp_path: Path) -> None:
    (tmp_path / "model.onnx").mkdir()
    (tmp_path / "validation").mkdir()
    r = cli("tune", tiny_spec(tmp_path), "--out", tmp_path / "run")
    assert r.exit_code == 3, r.output
    assert "is a folder" in r.stderr and "does not exist" not in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1


def test_torch_inductor_with_an_onnx_model_is_said_before_the_knobs_are_read(
        samples_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("torch", reason="torch is not installed")
    from dossier.backends.torch_inductor.backend import TorchInductorBackend

    def never(self: object) -> None:
        raise AssertionError("the knob database was read (torch imported) before the model "
                             "was checked")

    monkeypatch.setattr(TorchInductorBackend, "knob_database_impl", never)
    folder = tmp_path / "convnet"
    shutil.copytree(samples_dir / "convnet", folder)
    spec = folder / "release.toml"
    spec.write_text(spec.read_text().replace('backend = "onnxruntime"',
                                             'backend = "torch-inductor"'))
    assert 'backend = "torch-inductor"' in spec.read_text()
    r = cli("tune", spec, "--out", tmp_path / "run")
    assert r.exit_code == 3, r.output
    assert "model.onnx is ONNX: the torch-inductor backend takes an exported program" \
        in r.stderr, r.stderr
