"""Losses, admissibility and validation-set loading."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from dossier.errors import ValidationSetError
from dossier.tensors import read_tensors, write_tensors
from dossier.validation import judge, load_validation_set, loss

REF = np.array([1.0, -2.0, 4.0, 0.0], dtype=np.float32)
OUT = np.array([1.1, -2.0, 3.0, 0.5], dtype=np.float32)


def test_losses_match_hand_computation() -> None:
    d = np.array([0.1, 0.0, -1.0, 0.5])
    assert loss("l1", OUT, REF) == pytest.approx(np.mean(np.abs(d)), rel=1e-6)
    assert loss("l2", OUT, REF) == pytest.approx(np.mean(d * d), rel=1e-6)
    assert loss("linf", OUT, REF) == pytest.approx(1.0, rel=1e-6)
    # l0: |d| > atol + rtol*|r| with atol=0.2, rtol=0.1 -> thresholds .3 .4 .6 .2 -> 1.0 and 0.5 fail
    assert loss("l0", OUT, REF, atol=0.2, rtol=0.1) == pytest.approx(0.5)
    o, r = OUT.astype(float), REF.astype(float)
    cos = 1 - np.dot(o, r) / (np.linalg.norm(o) * np.linalg.norm(r))
    assert loss("cos", OUT, REF) == pytest.approx(cos, rel=1e-6)
    assert loss("cos", np.zeros(4), REF) == 1.0
    assert loss("linf", REF, REF) == 0.0


def test_nan_or_inf_output_has_no_loss() -> None:
    assert loss("l2", np.array([np.nan, 1.0]), np.array([1.0, 1.0])) is None
    assert loss("l1", np.array([np.inf, 1.0]), np.array([1.0, 1.0])) is None


def _write_set(root: Path, pairs: list[tuple[dict, dict]]) -> Path:
    for i, (inputs, refs) in enumerate(pairs):
        d = root / f"pair-{i:03d}"
        d.mkdir(parents=True)
        write_tensors(d / "inputs.arrow", inputs)
        write_tensors(d / "references.arrow", refs)
    return root


def test_judge_keeps_every_pair_and_names_the_failing_one(tmp_path: Path) -> None:
    vset = load_validation_set(_write_set(tmp_path / "v", [
        ({"x": np.zeros(2, np.float32)}, {"y": np.array([1.0, 2.0], np.float32)}),
        ({"x": np.ones(2, np.float32)}, {"y": np.array([3.0, 4.0], np.float32)}),
    ]))
    outputs = {"pair-000": {"y": np.array([1.0, 2.0])}, "pair-001": {"y": np.array([3.0, 4.5])}}
    res = judge(outputs, vset, "linf", 0.5)
    assert set(res.losses) == {"pair-000", "pair-001"}
    assert res.losses["pair-000"]["y"] == 0.0
    assert not res  # 0.5 >= 0.5: trtexec fails at loss >= threshold
    assert "pair-001" in res.failure and "'y'" in res.failure
    assert judge(outputs, vset, "linf", 0.51)
    nan = {"pair-000": {"y": np.array([np.nan, 2.0])}, "pair-001": outputs["pair-001"]}
    bad = judge(nan, vset, "linf", 10.0)
    assert not bad and "NaN" in bad.failure


def test_nan_reference_is_refused(tmp_path: Path) -> None:
    root = _write_set(tmp_path / "v", [({"x": np.zeros(2, np.float32)},
                                        {"y": np.array([np.nan, 1.0], np.float32)})])
    with pytest.raises(ValidationSetError, match="NaN or Inf"):
        load_validation_set(root)


def test_missing_or_empty_sets_are_refused(tmp_path: Path) -> None:
    with pytest.raises(ValidationSetError, match="not a folder"):
        load_validation_set(tmp_path / "nope")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValidationSetError, match="no pair-NNN"):
        load_validation_set(tmp_path / "empty")
    (tmp_path / "half" / "pair-000").mkdir(parents=True)
    write_tensors(tmp_path / "half" / "pair-000" / "inputs.arrow", {"x": np.zeros(1)})
    with pytest.raises(ValidationSetError, match="no references.arrow"):
        load_validation_set(tmp_path / "half")


def test_tensor_files_round_trip_and_garbage_is_refused(tmp_path: Path) -> None:
    data = {"a": np.arange(24, dtype=np.float32).reshape(2, 3, 4), "b": np.array([1, 2], np.int64)}
    write_tensors(tmp_path / "t.arrow", data)
    back = read_tensors(tmp_path / "t.arrow")
    assert all(np.array_equal(back[k], v) and back[k].dtype == v.dtype for k, v in data.items())
    (tmp_path / "junk.arrow").write_bytes(b"not arrow")
    with pytest.raises(ValidationSetError):
        read_tensors(tmp_path / "junk.arrow")


def test_digest_changes_with_any_tensor(tmp_path: Path) -> None:
    pairs = [({"x": np.zeros(3, np.float32)}, {"y": np.ones(3, np.float32)})]
    a = load_validation_set(_write_set(tmp_path / "a", pairs)).digest()
    pairs[0][1]["y"][1] = 1.0000001
    b = load_validation_set(_write_set(tmp_path / "b", pairs)).digest()
    assert a != b


def test_a_cos_rejection_of_an_all_zero_side_names_the_cause(tmp_path: Path) -> None:
    """cos is 1 when one side is all zeros (no direction); the rejection says which side."""
    vset = load_validation_set(_write_set(tmp_path / "v", [
        ({"x": np.zeros(2, np.float32)}, {"y": np.array([1e-9, 2e-9], np.float32)}),
        ({"x": np.ones(2, np.float32)}, {"y": np.zeros(2, np.float32)}),
    ]))
    zero_out = judge({"pair-000": {"y": np.zeros(2)}, "pair-001": {"y": np.zeros(2)}},
                     vset, "cos", 1e-3)
    assert not zero_out and "pair-000" in zero_out.failure
    assert "the output is all zeros, the reference is not" in zero_out.failure
    zero_ref = judge({"pair-000": {"y": np.array([1e-9, 2e-9])},
                      "pair-001": {"y": np.array([0.0, 1e-6])}}, vset, "cos", 1e-3)
    assert not zero_ref and "pair-001" in zero_ref.failure
    assert "the reference is all zeros" in zero_ref.failure
    small = judge({"pair-000": {"y": np.array([1.0001e-9, 2e-9])},
                   "pair-001": {"y": np.zeros(2)}}, vset, "cos", 1e-3)
    assert small  # correct small outputs pass: the metric is scale-free


def test_a_timed_sample_runs_one_inference_per_input_shape_and_the_pairs_take_turns(
        tmp_path: Path) -> None:
    """``[timing] inputs = "shapes"``: pairs sharing input names, shapes and dtypes form one
    group (in order of first appearance), a sample runs one pair of each, and sample i runs a
    group's pair i modulo its size; ``"pairs"``: every pair, every sample."""
    from dossier.jobs.worker import _timers, rotation

    def x(shape: tuple[int, ...], v: float, dtype: str = "float32") -> dict:
        return {"x": np.full(shape, v, dtype=dtype)}

    ref = {"y": np.zeros(2, dtype=np.float32)}
    vset = load_validation_set(_write_set(tmp_path / "v", [
        (x((1, 4), 0), ref), (x((2, 4), 1), ref), (x((1, 4), 2), ref),
        (x((1, 4), 3, "float64"), ref), (x((1, 4), 4), ref)]))
    groups = vset.timing_groups("shapes")
    assert [[p.name for p in g] for g in groups] == \
        [["pair-000", "pair-002", "pair-004"], ["pair-001"], ["pair-003"]]
    assert [len(g) for g in vset.timing_groups("pairs")] == [1] * 5
    assert rotation(groups) == 3 and rotation(vset.timing_groups("pairs")) == 1

    ran: list[int] = []

    class Runner:
        def prepare(self, inputs: dict) -> int:
            return int(inputs["x"].flat[0])

        def timed(self, prepared: int) -> float:
            ran.append(prepared)
            return 1.0

    fn = _timers(Runner(), groups)  # type: ignore[arg-type]
    assert [fn(i) for i in range(4)] == [3.0] * 4  # one inference per group
    assert ran == [0, 1, 3, 2, 1, 3, 4, 1, 3, 0, 1, 3]
    ran.clear()
    assert _timers(Runner(), vset.timing_groups("pairs"))(0) == 5.0  # type: ignore[arg-type]
    assert ran == [0, 1, 2, 3, 4]
