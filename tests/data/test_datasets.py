"""The three data sets of a release (calibration, validation, hold-out): reading, keeping them
apart, splitting one set into three, and what a search does with them."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import TINY_TIMING, cli, write_tiny_timing

from dossier.datasets import (
    SPLIT_RECORD,
    check_apart,
    load_calibration_set,
    row_digests,
    split,
)
from dossier.errors import InputError, OutputError, ValidationSetError
from dossier.spec import ReleaseSpec, load_spec
from dossier.tensors import write_tensors
from dossier.tuner import tune
from dossier.validation import load_validation_set


def _precision_sample(samples_dir: Path, tmp_path: Path) -> Path:
    dst = tmp_path / "tblock"
    shutil.copytree(samples_dir / "tblock", dst)
    return dst


def test_split_makes_three_disjoint_sets_and_records_the_draw(samples_dir: Path,
                                                              tmp_path: Path) -> None:
    src = tmp_path / "all"
    rng = np.random.default_rng(3)
    for i in range(10):
        pair = src / f"pair-{i:03d}"
        pair.mkdir(parents=True)
        x = rng.standard_normal((1, 4)).astype(np.float32)
        write_tensors(pair / "inputs.arrow", {"x": x})
        write_tensors(pair / "references.arrow", {"y": x * 2})
    r = split(src, tmp_path / "out", holdout=0.2, calibration=3, seed=7)
    assert (len(r.validation), len(r.holdout), len(r.calibration)) == (5, 2, 3)
    assert not set(r.validation) & set(r.holdout) and not set(r.calibration) & set(r.holdout)
    assert sorted(r.validation + r.holdout + r.calibration) == [f"pair-{i:03d}" for i in range(10)]
    val = load_validation_set(tmp_path / "out" / "validation")
    hold = load_validation_set(tmp_path / "out" / "holdout")
    cal = load_calibration_set(tmp_path / "out" / "calibration")
    check_apart(val, cal, hold)  # disjoint: no error
    record = json.loads((tmp_path / "out" / SPLIT_RECORD).read_text())
    assert record["seed"] == 7 and record["source"]["digest"] == load_validation_set(src).digest()
    again = split(src, tmp_path / "again", holdout=0.2, calibration=3, seed=7)
    assert (again.holdout, again.calibration) == (r.holdout, r.calibration)  # the seed decides
    other = split(src, tmp_path / "other", holdout=0.2, calibration=3, seed=8)
    assert (other.holdout, other.calibration) != (r.holdout, r.calibration)
    with pytest.raises(OutputError):
        split(src, tmp_path / "out", holdout=0.2, calibration=0, seed=7)
    with pytest.raises(InputError, match="leave none to validate"):
        split(src, tmp_path / "big", holdout=5, calibration=5, seed=7)
    assert not (tmp_path / "big").exists()


def test_overlapping_sets_are_refused_naming_the_samples(samples_dir: Path) -> None:
    val = load_validation_set(samples_dir / "tblock" / "validation")
    hold = load_validation_set(samples_dir / "tblock" / "holdout")
    cal = load_calibration_set(samples_dir / "tblock" / "calibration")
    check_apart(val, cal, hold)
    leaky = type(cal)(cal.path, (*cal.samples, ("sample-999", val.pairs[1].inputs)))
    with pytest.raises(ValidationSetError, match="calibration sample sample-999 = validation "
                       "pair pair-001") as exc:
        check_apart(val, leaky, hold)
    assert row_digests(val.pairs[1].inputs)[0][:12] in str(exc.value)
    held_twice = type(hold)(hold.path, (*hold.pairs, val.pairs[0]))
    with pytest.raises(ValidationSetError, match="hold-out pair pair-000 = validation pair"):
        check_apart(val, None, held_twice)


def test_a_calibration_set_must_hold_finite_inputs(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValidationSetError, match="is empty"):
        load_calibration_set(tmp_path / "empty")
    bad = tmp_path / "nan" / "sample-000"
    bad.mkdir(parents=True)
    write_tensors(bad / "inputs.arrow", {"x": np.array([[np.nan, 1.0]], np.float32)})
    with pytest.raises(ValidationSetError, match="NaN or Inf"):
        load_calibration_set(tmp_path / "nan")


@pytest.mark.parametrize("damage, message", [
    ("overlap", "the data sets overlap: calibration sample"),
    ("name", "calibration sample sample-000: inputs lack 'x'"),
    ("dtype", "calibration sample sample-000: input 'x' has dtype float64"),
    ("empty", "is empty"),
    ("no-calibration", "need a calibration set"),
])
def test_bad_calibration_input_is_one_line_exit_3_before_any_build(
        samples_dir: Path, tmp_path: Path, damage: str, message: str) -> None:
    folder = _precision_sample(samples_dir, tmp_path)
    spec = folder / "release-int8.toml"
    write_tiny_timing(spec)
    first = folder / "calibration" / "sample-000" / "inputs.arrow"
    if damage == "overlap":
        shutil.copy(folder / "validation" / "pair-002" / "inputs.arrow", first)
    elif damage == "name":
        write_tensors(first, {"z": np.zeros((1, 32, 128), np.float32)})
    elif damage == "dtype":
        write_tensors(first, {"x": np.zeros((1, 32, 128), np.float64)})
    elif damage == "empty":
        shutil.rmtree(folder / "calibration")
        (folder / "calibration").mkdir()
    else:
        text = spec.read_text().replace('[calibration]\npath = "calibration"\n', "")
        spec.write_text(text)
    r = cli("tune", spec, "--out", tmp_path / "run")
    assert r.exit_code == 3, r.output
    assert message in r.stderr and len(r.stderr.strip().splitlines()) <= 2, r.stderr
    assert not (tmp_path / "run").exists() or not any((tmp_path / "run").iterdir())


def test_the_hold_out_gate_keeps_a_route_that_breaks_out_of_range_from_shipping(
        samples_dir: Path, tmp_path: Path) -> None:
    """``fault=drift`` is 1.5x faster (on the faulty backend's clock: confirmed on any host)
    and right on the validation set, wrong on inputs of large magnitude; the hold-out set holds
    such an input. The confirmation confirms it, the hold-out check stops it, and the record
    says why."""
    folder = _precision_sample(samples_dir, tmp_path)
    hold = folder / "holdout" / "pair-000"
    x = load_validation_set(folder / "holdout").pairs[0].inputs["x"] * 4
    write_tensors(hold / "inputs.arrow", {"x": x})
    spec_path = folder / "release-int8.toml"
    spec = load_spec(spec_path, {"backend": "faulty", "strategy": "full",
                                 "selection": "-pace=clock -fault=[none|drift] "
                                              "-intra_op_num_threads=1"})
    build = sys.modules["samples_build"]  # the samples_dir fixture loaded it
    weights = build.tblock_weights(np.random.default_rng(build.TBLOCK_SEED))
    write_tensors(hold / "references.arrow", build.tblock_reference(weights, x))
    timing = TINY_TIMING.model_copy(update={"confirm_top": 1, "confirm_rounds": 4,
                                            "confirm_runs": 10})
    res = tune(spec.model_copy(update={"timing": timing}), tmp_path / "run")
    d = res.decision
    drift = "-fault=drift -intra_op_num_threads=1 -pace=clock"
    checks = {h.route: h for h in res.cache.holdouts}
    base = checks[d.baseline_route]
    assert base.passed and base.pairs == 3  # the baseline is checked beside, and passes
    assert d.shipped_route != drift and not d.gain
    # the confirmation confirmed it (a known 1.5x): the hold-out check stopped it
    assert d.holdout_rejected == [drift], d.reason
    assert not checks[drift].passed and "pair-000" in (checks[drift].reason or "")
    assert "failed the hold-out set" in d.reason
    assert d.holdout is not None and d.holdout.route == d.shipped_route


def _known_gain_spec(samples_dir: Path, tmp_path: Path) -> ReleaseSpec:
    """The tblock sample's int8 spec (its hold-out set) on the faulty backend, searching a
    known 1.25x gain on its clock (confirmed however busy the host), one candidate confirmed."""
    folder = _precision_sample(samples_dir, tmp_path)
    spec = load_spec(folder / "release-int8.toml", {
        "backend": "faulty", "strategy": "full",
        "selection": "-pace=clock -gain=[none|x1.25] -intra_op_num_threads=1"})
    return spec.model_copy(update={"timing": TINY_TIMING.model_copy(update={"confirm_top": 1})})


def test_the_baseline_and_the_route_about_to_ship_are_checked_on_the_hold_out_set_at_once(
        samples_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Nothing is timed once the confirmation has decided: the two hold-out checks run in two
    processes at the same time (both started before either is awaited), and are recorded in
    order, the baseline's first."""
    import dossier.executors.local as local_module

    events: list[tuple[str, str]] = []

    class Recording(local_module.Child):  # type: ignore[name-defined,misc]
        def __init__(self, req, *args, **kwargs):  # type: ignore[no-untyped-def]
            super().__init__(req, *args, **kwargs)
            self.route = req.route
            self.check = req.mode == "validate"  # the scheduler's other processes: trials
            if self.check:
                events.append(("start", req.route))

        def wait(self):  # type: ignore[no-untyped-def]
            if self.check:
                events.append(("wait", self.route))
            return super().wait()

    monkeypatch.setattr(local_module, "Child", Recording)
    res = tune(_known_gain_spec(samples_dir, tmp_path), tmp_path / "run")
    d = res.decision
    assert d.gain, d.reason  # a known 1.25x gain
    assert events == [("start", d.baseline_route), ("start", d.shipped_route),
                      ("wait", d.baseline_route), ("wait", d.shipped_route)]
    assert [h.route for h in res.cache.holdouts] == [d.baseline_route, d.shipped_route]
    assert all(h.passed for h in res.cache.holdouts)


def test_an_interrupted_hold_out_check_leaves_no_check_running(
        samples_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Ctrl-C while the first of the two checks is awaited: the search stops as interrupted,
    and the second check's process does not outlive it; run again, the search resumes and
    records both checks."""
    import dossier.executors.local as local_module

    children: list[object] = []

    class Interrupted(local_module.Child):  # type: ignore[name-defined,misc]
        def __init__(self, req, *args, **kwargs):  # type: ignore[no-untyped-def]
            super().__init__(req, *args, **kwargs)
            if req.mode == "validate":  # the scheduler's other processes: trials
                children.append(self)

        def wait(self):  # type: ignore[no-untyped-def]
            if len(children) == 2 and self is children[0]:
                raise KeyboardInterrupt
            return super().wait()

    monkeypatch.setattr(local_module, "Child", Interrupted)
    with pytest.raises(KeyboardInterrupt):
        tune(_known_gain_spec(samples_dir, tmp_path), tmp_path / "run")
    assert len(children) == 2
    assert all(c.proc.poll() is not None for c in children)  # type: ignore[attr-defined]
    monkeypatch.undo()
    from dossier.run_folder import CACHE_NAME
    from dossier.tuner import continue_tune

    res = continue_tune(tmp_path / "run" / CACHE_NAME)
    assert res.decision.gain and len(res.cache.holdouts) == 2


@pytest.fixture(scope="module")
def int8_release(samples_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tblock sample's int8 spec released once (small timing): its bundle."""
    folder = tmp_path_factory.mktemp("int8") / "tblock"
    shutil.copytree(samples_dir / "tblock", folder)
    spec = folder / "release-int8.toml"
    spec.write_text(spec.read_text().replace(
        'selection = "-quantization=[none|dynamic|static] -quant_per_channel=[off|on]"',
        'selection = "-quantization=[none|dynamic|static]"'))
    write_tiny_timing(spec)
    r = cli("release", spec, "--out", folder.parent / "out", "--quiet")
    assert r.exit_code == 0, r.stderr
    return folder.parent / "out" / "tblock-int8-1.dossier"


def test_the_bundle_carries_the_sets_their_digests_and_the_hold_out_check(
        int8_release: Path, samples_dir: Path) -> None:
    from dossier.bundle import open_bundle

    record = json.loads((int8_release / "datasets.json").read_text())
    roles = {s["role"]: s for s in record["sets"]}
    cal = load_calibration_set(samples_dir / "tblock" / "calibration")
    hold = load_validation_set(samples_dir / "tblock" / "holdout")
    assert roles["calibration"]["digest"] == cal.digest() and roles["calibration"]["size"] == 16
    assert roles["holdout"]["digest"] == hold.digest() and roles["holdout"]["size"] == 3
    assert roles["holdout"]["path"] == "holdout"  # the bundle's folder, not the tuning host's
    assert load_validation_set(int8_release / "holdout").digest() == hold.digest()
    assert load_calibration_set(int8_release / "calibration").digest() == cal.digest()
    with open_bundle(int8_release) as b:
        d = b.tuning_cache().decision
        assert d is not None and d.holdout is not None
        assert record["holdout_check"]["route"] == d.shipped_route == d.holdout.route
        manifest_files = {f.path for f in b.manifest.files}
    assert {"datasets.json", "holdout/pair-000/references.arrow",
            "calibration/sample-015/inputs.arrow"} <= manifest_files
    if "quantization=none" not in d.shipped_route:  # an int8 route shipped: its settings too
        doc = json.loads((int8_release / "engine" / "quantization.json").read_text())
        assert doc["facts"]["quantization"] in ("dynamic", "static")
    assert cli("verify", int8_release, "--integrity-only").exit_code == 0


def test_explain_shows_the_trade_the_same_in_text_and_json(int8_release: Path) -> None:
    data = json.loads(cli("explain", int8_release, "--json").stdout)
    trade = data["trade"]
    assert trade["holdout_pairs"] == 3 and trade["metric"] == "cos"
    routes = {p["route"]: p for p in trade["points"]}
    assert len(routes) == 3  # none, dynamic, static: each validated once
    base = next(p for p in trade["points"] if p["reading"] == "baseline")
    assert base["holdout_passed"] is True and base["speedup"] == 1.0
    int8 = [p for r, p in routes.items() if "quantization=none" not in r]
    assert all(p["worst_loss"] > 100 * base["worst_loss"] for p in int8)  # int8 changes numbers
    text = cli("explain", int8_release, columns=250).stdout
    assert "Accuracy against speed" in text
    for p in trade["points"]:
        assert f"worst cos loss {p['worst_loss']:.3g} against 0.001" in text
        if p["reading"] == "confirmed":  # the confirmation's figure, and what it concluded
            assert p["confirmation"] in ("confirmed", "futile", "outranked", "undecided")
            shown = ("confirmed" if p["confirmation"] == "confirmed" else
                     f"in the confirmation, not confirmed ({p['confirmation']})")
            assert f"] {shown}; worst cos loss {p['worst_loss']:.3g}" in text
    md = cli("explain", int8_release, "--format", "markdown").stdout
    assert "Accuracy against speed" in md


def test_crafted_hold_out_records_are_refused(int8_release: Path, tmp_path: Path) -> None:
    """A hold-out check of a route never tried, or a decision shipping a route that failed the
    hold-out set, does not fit the search record: refused when the record is read back."""
    from dossier.cache import HoldoutRecord, TuningCache
    from dossier.cache_check import check_cache
    from dossier.errors import CacheMismatchError
    from dossier.knobs import KnobDatabase

    run = tmp_path / "run"
    shutil.copytree(int8_release, run)
    lines = (run / "tuning-cache.jsonl").read_text().splitlines()
    db = KnobDatabase.model_validate_json((run / "knobs.json").read_text())
    at = next(i for i, line in enumerate(lines) if '"kind":"holdout"' in line)
    bogus = HoldoutRecord(route="-quantization=static", trial_index=0, passed=True, pairs=3)
    (run / "tuning-cache.jsonl").write_text("\n".join(
        [*lines[:at], bogus.model_dump_json(), *lines[at:]]) + "\n")
    with pytest.raises(CacheMismatchError, match="not an admissible trial of that route"):
        check_cache(TuningCache.open(run / "tuning-cache.jsonl"), db, run, digests=False)
    decision = json.loads(lines[-2] if '"kind":"decision"' in lines[-2] else lines[-1])
    if decision["gain"]:
        shipped = decision["shipped_route"]
        failed = HoldoutRecord(route=shipped, trial_index=decision["shipped_index"],
                               passed=False, reason="crafted", pairs=3)
        edited = [failed.model_dump_json() if json.loads(line).get("kind") == "holdout"
                  and json.loads(line)["route"] == shipped else line for line in lines]
        assert edited != lines
        (run / "tuning-cache.jsonl").write_text("\n".join(edited) + "\n")
        with pytest.raises(CacheMismatchError, match="failed the hold-out set"):
            check_cache(TuningCache.open(run / "tuning-cache.jsonl"), db, run, digests=False)


def test_recheck_runs_the_hold_out_set_too(int8_release: Path) -> None:
    r = cli("verify", int8_release, "--recheck", "--json")
    assert r.exit_code == 0, r.output
    report = json.loads(r.stdout)
    held = report["recheck_holdout"]
    assert held["data_set"] == "holdout" and held["passed"]
    assert set(held["losses"]) == {"pair-000", "pair-001", "pair-002"}
    assert held["recorded_worst_loss"] == pytest.approx(held["worst_loss"], rel=1e-3, abs=1e-12)
    assert report["recheck"]["data_set"] == "validation"
    text = cli("verify", int8_release, "--recheck", columns=200).stdout
    assert "accuracy re-check on the hold-out set passed" in text
