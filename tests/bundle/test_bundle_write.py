"""Writing bundles: ``dossier release`` and ``dossier bundle``, the bundle's contents and tables,
the writer's refusals, its warnings, and atomicity under kill -9."""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import _bundles as h
import pyarrow as pa
import pytest

from dossier.backends import describe
from dossier.bundle import check_integrity, coverage_warnings, open_bundle, write_bundle
from dossier.bundle.tables import KNOB_PREFIX, ROUTES_HEAD, ROUTES_TAIL
from dossier.cache import TuningCache
from dossier.errors import ExitCode, InputError
from dossier.hashing import digest_file
from dossier.spec import ShapeEntry


def _copy_run(rel: dict[str, h.Released], tmp_path: Path, name: str = "convnet") -> Path:
    run = tmp_path / "run"
    shutil.copytree(rel[name].run, run)
    return run


# ------------------------------------------------------------------------------ release/inspect
@pytest.mark.parametrize("name", ["convnet", "tblock"])
def test_release_writes_a_bundle_that_inspect_explains(rel: dict[str, h.Released],
                                                       name: str) -> None:
    r = rel[name]
    assert r.bundle.is_dir()
    assert r.stdout.strip() == str(r.bundle)
    assert sorted(p.name for p in r.out.iterdir()) == [".runs", f"{name}-1.dossier"]
    decision = TuningCache.open(r.run / "tuning-cache.jsonl").decision
    assert decision is not None

    res = h.cli("inspect", r.bundle, "--json")
    assert res.exit_code == 0, res.stderr
    o = json.loads(res.stdout)
    assert (o["release"], o["version"], o["backend"]) == (name, 1, "onnxruntime")
    assert (o["metric"], o["threshold"]) == ("linf", 1e-4)
    assert o["baseline"]["route"] == "-graph_optimization_level=all"
    b = o["baseline"]
    assert 0 < b["sample_ci_low_ms"] <= b["sample_median_ms"] <= b["sample_ci_high_ms"]
    assert b["samples"] == h.SMALL_TIMING["samples"]
    assert o["winner"]["route"] == decision.shipped_route
    assert o["gain"] is decision.gain
    if o["gain"]:
        sp = o["speedup"]
        assert sp["ci_low"] <= sp["value"] <= sp["ci_high"] and sp["p_value"] < 0.05
        assert sp["confidence"] == 0.95
        assert o["result"].startswith(f"{sp['value']:.3f}x [")
    else:
        assert o["speedup"] is None and o["result"] == "no significant gain"
        assert o["reason"].startswith("no significant gain") and o["reason"] == decision.reason
    assert sum(o["trials"].values()) == 2
    assert o["dossier_id"] == json.loads((r.bundle / "manifest.json").read_text())["dossier_id"]
    assert o["tuning_host"]["onnxruntime"]


def test_inspect_text_names_the_essentials(rel: dict[str, h.Released]) -> None:
    res = h.cli("inspect", rel["tblock"].bundle)
    assert res.exit_code == 0, res.stderr
    text = res.stdout
    for needle in ("tblock version 1", "dossier id", "parent       none",
                   "accuracy     linf < 0.0001 on every output of 3 pair(s)",
                   "baseline     -graph_optimization_level=all", "shipped", "speedup", "why",
                   "trials       ok 2", "tuning host", "warning      no validation pair covers "
                   "the largest shape entry #3"):
        assert needle in text, needle


# ------------------------------------------------------------------------------------ contents
def test_bundle_holds_the_layout_of_format_1(rel: dict[str, h.Released]) -> None:
    r = rel["convnet"]
    sample = h.samples()["convnet"]
    with open_bundle(r.bundle) as b:
        m = b.manifest
        paths = [f.path for f in m.files]
        assert paths == sorted(paths)
        assert {"engine/convnet.ort", "model/model.onnx", "model.json", "knobs.json",
                "routes.parquet", "timings.parquet", "shapes.parquet", "validation.json",
                "validation/provenance.json", "tuning-cache.jsonl", "fingerprint.json"} <= set(paths)
        for pair in ("pair-000", "pair-001", "pair-002"):
            for role in ("inputs", "references"):
                rel_path = f"validation/{pair}/{role}.arrow"
                assert digest_file(b.path / rel_path) == digest_file(sample / rel_path)
        for name in ("knobs.json", "fingerprint.json", "tuning-cache.jsonl"):
            assert (b.path / name).read_bytes() == (r.run / name).read_bytes()
        ident = b.model_identity()
        assert (ident.file_name, (ident.digest, ident.size)) == (
            "model.onnx", digest_file(sample / "model.onnx"))
        assert ident == m.model and m.model_included
        info = b.validation_info()
        assert (info.metric, info.threshold, info.pairs) == ("linf", 1e-4,
                                                            ["pair-000", "pair-001", "pair-002"])
        assert info.references.startswith("float64 numpy reimplementation")
        assert info.pair_inputs["pair-002"] == {"x": [8, 3, 32, 32]}
        assert b.fingerprint().python.version
        assert m.format == "dossier-bundle" and m.format_version == "1.1"
        assert m.engines.shipped.route == m.summary.shipped_route
        assert m.engines.baseline.route == m.summary.baseline_route
        assert m.engines.shipped.flags == {
            "layout_optimized": m.summary.shipped_route == "-graph_optimization_level=all",
            "openvino": False}
        s = m.summary
        assert (s.strategy, s.selection) == ("full", h.SELECTIONS["convnet"])
        assert s.search_wall_s > 0 and s.build_s_total > 0 and s.sessions == 1
        assert s.decision_rule.startswith("the 1 admissible routes screened fastest")
        assert s.aa is not None and s.aa.trial_index == 0 and m.engines.shipped.load is not None
        assert m.warnings == []
        assert check_integrity(b)


def test_tables_hold_every_trial_and_sample(rel: dict[str, h.Released]) -> None:
    r = rel["convnet"]
    cache = TuningCache.open(r.run / "tuning-cache.jsonl")
    with open_bundle(r.bundle) as b:
        routes, timings, shapes = b.routes(), b.timings(), b.shapes()
    knob = KNOB_PREFIX + "graph_optimization_level"
    assert routes.column_names == [n for n, _ in ROUTES_HEAD] + [knob] + [n for n, _ in ROUTES_TAIL]
    assert routes.schema.field("losses").type == pa.list_(
        pa.struct([("pair", pa.string()), ("output", pa.string()), ("loss", pa.float64())]))
    rows = routes.to_pylist()
    assert [row["index"] for row in rows] == [t.index for t in cache.trials]
    for row, t in zip(rows, cache.trials):
        assert (row["role"], row["route"], row["outcome"]) == (t.role, t.route, t.outcome.value)
        assert row[knob] == t.route.split("=")[1]
        assert {(x["pair"], x["output"]): x["loss"] for x in row["losses"]} == {
            (p, o): v for p, per in t.losses.items() for o, v in per.items()}
        assert row["median_ms"] == t.timing.median_ms and row["n"] == t.timing.n
        assert row["speedup"] == t.comparison.speedup
        assert row["p_value"] == t.comparison.p_value
        assert row["rank"] == (1 if t.role == "search" and t.admissible else None)
        assert row["shipped"] is (t.index == cache.decision.shipped_index)
    n = sum(len(t.samples_ms or ()) + len(t.baseline_samples_ms or ()) for t in cache.trials)
    assert timings.num_rows == n
    assert set(timings.column("series").to_pylist()) == {"candidate", "baseline"}
    first = [x["ms"] for x in timings.to_pylist() if x["trial"] == 0 and x["series"] == "candidate"]
    assert first == cache.trials[0].samples_ms
    assert shapes.to_pylist() == [
        {"entry": 0, "weight": 0.2, "input": "x", "dims": [1, 3, 32, 32]},
        {"entry": 1, "weight": 0.5, "input": "x", "dims": [4, 3, 32, 32]},
        {"entry": 2, "weight": 0.3, "input": "x", "dims": [8, 3, 32, 32]}]


# ------------------------------------------------------------------------------------ warnings
def test_uncovered_shape_extreme_is_warned_and_recorded(rel: dict[str, h.Released]) -> None:
    with open_bundle(rel["tblock"].bundle) as b:
        warnings = b.manifest.warnings
    assert len(warnings) == 1
    assert "largest shape entry #3 (x=[16, 32, 128])" in warnings[0]
    assert "warning: no validation pair covers the largest" in rel["tblock"].stderr


def test_coverage_warnings() -> None:
    pairs = {"pair-000": {"x": [1, 3]}, "pair-001": {"x": [8, 3]}}
    entries = [ShapeEntry(inputs={"x": [4, 3]}), ShapeEntry(inputs={"x": [1, 3]}),
               ShapeEntry(inputs={"x": [8, 3]})]
    assert coverage_warnings(pairs, entries) == []
    assert coverage_warnings(pairs, []) == []
    one = coverage_warnings({"pair-000": {"x": [1, 3]}}, entries[1:2])
    assert len(one) == 1 and "fewer than two" in one[0]
    small = coverage_warnings(pairs, [ShapeEntry(inputs={"x": [2, 3]}), entries[2]])
    assert len(small) == 1 and "smallest shape entry #0" in small[0]
    both = coverage_warnings(pairs, [ShapeEntry(inputs={"x": [2, 3]}),
                                     ShapeEntry(inputs={"x": [9, 3]})])
    assert [("smallest" in w, "largest" in w) for w in both] == [(True, False), (False, True)]
    two_inputs = coverage_warnings({"a": {"x": [1], "y": [2]}, "b": {"x": [1], "y": [3]}},
                                   [ShapeEntry(inputs={"x": [1], "y": [3]})])
    assert two_inputs == []


# -------------------------------------------------------------------------------- bundle command
def test_bundle_from_the_cache_file_without_model_with_parent(rel: dict[str, h.Released],
                                                              tmp_path: Path) -> None:
    r = rel["convnet"]
    parent = json.loads((r.bundle / "manifest.json").read_text())["dossier_id"]
    res = h.cli("bundle", r.run / "tuning-cache.jsonl", "--out", tmp_path, "--no-model",
                "--parent", parent, "--json")
    assert res.exit_code == 0, res.stderr
    o = json.loads(res.stdout)
    assert o["parent"] == parent and o["dossier_id"] != parent
    with open_bundle(Path(o["bundle"])) as b:
        assert b.manifest.parent == parent and not b.manifest.model_included
        assert not any(f.path.startswith("model/") for f in b.manifest.files)
        assert b.model_identity() == b.manifest.model
        assert b.manifest.model.digest == digest_file(h.samples()["convnet"] / "model.onnx")[0]
        assert check_integrity(b)
    shown = json.loads(h.cli("inspect", o["bundle"], "--json").stdout)
    assert shown["parent"] == parent and shown["model"]["included"] is False


def test_bad_parent_is_refused(rel: dict[str, h.Released], tmp_path: Path) -> None:
    res = h.cli("bundle", rel["convnet"].run, "--out", tmp_path / "out", "--parent", "xyz")
    assert res.exit_code == ExitCode.INPUT
    assert not (tmp_path / "out").exists()


def test_unfinished_search_is_refused(rel: dict[str, h.Released], tmp_path: Path) -> None:
    run = _copy_run(rel, tmp_path)
    h.rewrite_cache(run / "tuning-cache.jsonl",
                    lambda r: None if r["kind"] in ("decision", "session") else r)
    out = tmp_path / "out"
    for source in (run, run / "tuning-cache.jsonl"):
        res = h.cli("bundle", source, "--out", out)
        assert res.exit_code == ExitCode.TUNE
        assert "the search has not finished; dossier tune --continue it" in h.said(res)
    assert not out.exists()


def test_output_exists_is_refused_and_nothing_is_written(rel: dict[str, h.Released],
                                                        tmp_path: Path) -> None:
    out = tmp_path / "out"
    assert h.cli("bundle", rel["convnet"].run, "--out", out).exit_code == 0
    before = h.snapshot(out)
    res = h.cli("bundle", rel["convnet"].run, "--out", out)
    assert res.exit_code == ExitCode.OUTPUT
    assert "exists already" in h.said(res)
    spec = tmp_path / "spec" / "release.toml"
    h.write_spec(spec, h.samples()["convnet"])
    res = h.cli("release", spec, "--out", out)  # refused before any tuning
    assert res.exit_code == ExitCode.OUTPUT
    assert h.snapshot(out) == before


@pytest.mark.parametrize("held", ["convnet-3.dossier.tar", "convnet-2.dossier", "convnet-1.dossier"])
def test_release_versions_must_increase(rel: dict[str, h.Released], tmp_path: Path,
                                        held: str) -> None:
    out = tmp_path / "out"
    out.mkdir()
    if held.endswith(".dossier"):
        (out / held).mkdir()
    else:
        (out / held).write_bytes(b"")
    (out / "convnetx-9.dossier").mkdir()  # another release: irrelevant
    before = h.snapshot(out)
    res = h.cli("bundle", rel["convnet"].run, "--out", out)
    assert res.exit_code == ExitCode.OUTPUT
    version = held.split("-")[1].split(".")[0]
    if version == "1":
        assert "exists already" in h.said(res)
    else:
        assert "release versions must increase;" in h.said(res)
        assert f"holds convnet-{version} (set [release] version above {version}" in h.said(res)
    assert h.snapshot(out) == before


def test_lower_versions_do_not_block(rel: dict[str, h.Released], tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    (out / "convnet-0.dossier.tar").write_bytes(b"")
    assert h.cli("bundle", rel["convnet"].run, "--out", out).exit_code == 0


def test_baseline_engine_ships_alongside_a_winner(rel: dict[str, h.Released],
                                                  tmp_path: Path) -> None:
    run = _copy_run(rel, tmp_path)
    search = next(t for t in TuningCache.open(run / "tuning-cache.jsonl").trials
                  if t.role == "search")

    def ship_search(r: dict) -> dict:
        if r["kind"] == "decision":
            r.update(shipped_route=search.route, shipped_index=search.index, gain=True,
                     speedup=1.5, speedup_ci_low=1.25, speedup_ci_high=1.75, p_value=0.001,
                     reason="test: the search route won")
        return r

    h.rewrite_cache(run / "tuning-cache.jsonl", ship_search)
    written = write_bundle(run, tmp_path / "out")
    m = written.manifest
    assert (m.engines.shipped.path, m.engines.baseline.path) == (
        "engine/convnet.ort", "engine/convnet.baseline.ort")
    assert m.engines.shipped.route == search.route and m.engines.shipped.trial_index == 1
    assert m.engines.baseline.trial_index == 0
    assert m.engines.shipped.digest == digest_file(run / "engines" / "trial-0001.ort")[0]
    assert m.engines.baseline.digest == digest_file(run / "engines" / "trial-0000.ort")[0]
    o = json.loads(h.cli("inspect", written.path, "--json").stdout)
    assert o["gain"] and o["speedup"] == {"value": 1.5, "ci_low": 1.25, "ci_high": 1.75,
                                         "confidence": 0.95, "p_value": 0.001}
    assert o["result"] == "1.500x [1.250, 1.750] (p=0.001)" and not o["winner"]["is_baseline"]
    text = h.cli("inspect", written.path).stdout
    assert "speedup      1.500x [1.250, 1.750] (95% CI), p=0.001" in text


def test_load_configuration_and_engine_flags_are_the_ones_the_search_recorded(
        rel: dict[str, h.Released], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The search records a kept engine's production load configuration and engine flags with
    its trial, from the backend it ran; the writer ships those and asks no backend."""
    run = _copy_run(rel, tmp_path)
    cache = run / "tuning-cache.jsonl"
    trials = TuningCache.open(cache).trials
    assert any(t.engine for t in trials)
    for t in trials:
        assert (t.load is not None and t.engine_flags is not None) is bool(t.engine), t
    manifest = json.loads((rel["convnet"].bundle / "manifest.json").read_text())
    shipped = manifest["engines"]["shipped"]
    recorded = next(t for t in trials if t.index == shipped["trial_index"])
    assert recorded.load is not None and shipped["load"] == recorded.load.model_dump(mode="json")
    assert shipped["flags"] == recorded.engine_flags

    def mark(r: dict) -> dict:
        if r["kind"] == "trial" and r.get("load"):
            r["load"]["note"] = f"recorded for trial {r['index']}"
            r["engine_flags"] = {"recorded": True}
        return r

    def no_backend(name: str) -> None:
        raise AssertionError(f"the writer asked the backend {name}")

    h.rewrite_cache(cache, mark)
    monkeypatch.setattr("dossier.backends.registry.get_backend", no_backend)
    e = write_bundle(run, tmp_path / "out", describe=describe).manifest.engines.shipped
    assert e.load is not None and e.load.note == f"recorded for trial {e.trial_index}"
    assert e.flags == {"recorded": True}


def test_trials_recorded_without_load_configuration_still_bundle(rel: dict[str, h.Released],
                                                                 tmp_path: Path) -> None:
    """A run tuned before trials recorded ``load`` and ``engine_flags`` still bundles: the
    writer asks the backend through what its caller passes (the bundle layer imports no
    backend), which gives what the search records now; without it, one clear refusal."""
    run = _copy_run(rel, tmp_path)

    def strip(r: dict) -> dict:
        if r["kind"] == "trial":
            del r["load"], r["engine_flags"]
        return r

    h.rewrite_cache(run / "tuning-cache.jsonl", strip)
    assert all(t.load is None and t.engine_flags is None
               for t in TuningCache.open(run / "tuning-cache.jsonl").trials)
    with pytest.raises(InputError, match="before runs recorded their load configuration"):
        write_bundle(run, tmp_path / "refused")
    assert not (tmp_path / "refused").exists() or list((tmp_path / "refused").iterdir()) == []
    got = write_bundle(run, tmp_path / "out", describe=describe).manifest.engines.model_dump(
        mode="json")
    want = json.loads((rel["convnet"].bundle / "manifest.json").read_text())["engines"]
    assert got["shipped"]["load"] is not None
    assert (got["shipped"]["load"], got["shipped"]["flags"]) == (want["shipped"]["load"],
                                                                 want["shipped"]["flags"])


def test_engine_changed_since_the_search_is_refused(rel: dict[str, h.Released],
                                                   tmp_path: Path) -> None:
    run = _copy_run(rel, tmp_path)
    with open(run / "engines" / "trial-0000.ort", "ab") as f:
        f.write(b"\0")
    out = tmp_path / "out"
    res = h.cli("bundle", run, "--out", out)
    assert res.exit_code == ExitCode.INPUT and "changed since the search" in h.said(res)
    assert list(out.iterdir()) == []  # the staging folder is gone too


def test_model_external_data_is_identified_and_bundled(rel: dict[str, h.Released],
                                                      tmp_path: Path) -> None:
    import onnx

    run = _copy_run(rel, tmp_path)
    model_dir = tmp_path / "model"
    model_dir.mkdir()
    proto = onnx.load(str(h.samples()["convnet"] / "model.onnx"))
    onnx.save_model(proto, str(model_dir / "model.onnx"), save_as_external_data=True,
                    all_tensors_to_one_file=True, location="weights.bin", size_threshold=0)
    digest, size = digest_file(model_dir / "model.onnx")

    def point_at_model(r: dict) -> dict:
        if r["kind"] == "header":
            r["model"] = {"path": str(model_dir / "model.onnx"), "size": size, "digest": digest}
        return r

    h.rewrite_cache(run / "tuning-cache.jsonl", point_at_model)
    weights = digest_file(model_dir / "weights.bin")
    for include, out in ((True, tmp_path / "with"), (False, tmp_path / "without")):
        m = write_bundle(run, out, include_model=include).manifest
        assert [(e.path, e.digest, e.size) for e in m.model.external_data] == [
            ("weights.bin", *weights)]
        table = m.table()
        assert ("model/weights.bin" in table) is include
        assert ("model/model.onnx" in table) is include
        with open_bundle(out / "convnet-1.dossier") as b:
            assert b.model_identity() == m.model and check_integrity(b)


def test_release_resumes_its_run_folder(rel: dict[str, h.Released], tmp_path: Path) -> None:
    run = _copy_run(rel, tmp_path)
    before = len(TuningCache.open(run / "tuning-cache.jsonl").trials)
    spec = h.write_spec(tmp_path / "spec" / "release.toml", h.samples()["convnet"])
    res = h.cli("release", spec, "--out", tmp_path / "out", "--work", run, "--quiet")
    assert res.exit_code == 0, res.stderr
    assert len(TuningCache.open(run / "tuning-cache.jsonl").trials) == before
    assert (tmp_path / "out" / "convnet-1.dossier" / "manifest.json").is_file()
    assert not (tmp_path / "out" / ".runs").exists()


# ----------------------------------------------------------------------------------- atomicity
_WRITER = """
import sys
from pathlib import Path
from dossier.bundle import write_bundle
print("go", flush=True)
write_bundle(Path(sys.argv[1]), Path(sys.argv[2]))
"""


def _start(run: Path, out: Path) -> subprocess.Popen[str]:
    proc = subprocess.Popen([sys.executable, "-c", _WRITER, str(run), str(out)],
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdout.readline() == "go\n"
    proc.stdout.close()
    return proc


def test_kill_9_never_leaves_a_partial_bundle(rel: dict[str, h.Released],
                                              tmp_path: Path) -> None:
    run = _copy_run(rel, tmp_path)
    engine = run / "engines" / "trial-0000.ort"
    with open(engine, "wb") as f:  # a big engine makes the write last long enough to interrupt
        for _ in range(64):
            f.write(os.urandom(1 << 20))
    digest = digest_file(engine)[0]
    h.rewrite_cache(run / "tuning-cache.jsonl", lambda r: {**r, "engine_digest": digest}
                    if r["kind"] == "trial" and r["index"] == 0 else r)
    out = tmp_path / "out"
    target = out / "convnet-1.dossier"

    t0 = time.perf_counter()
    proc = _start(run, out)
    assert proc.wait() == 0
    duration = time.perf_counter() - t0
    shutil.rmtree(target)

    rng = random.Random(1234)
    interrupted = 0
    for attempt in range(8):
        before = set(out.iterdir())
        proc = _start(run, out)
        if attempt % 2:  # wait until the writer has created its folder, then a moment more
            while not set(out.iterdir()) - before and proc.poll() is None:
                time.sleep(0.001)
            time.sleep(rng.uniform(0, 0.005))  # within the 64 MiB copy, even on a loaded host
        else:
            time.sleep(rng.uniform(0, duration))
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        interrupted += any(".staging-" in p.name for p in set(out.iterdir()) - before)
        if target.exists():  # only if the writer finished before the kill: then it is whole
            with open_bundle(target) as b:  # a half-written bundle would fail here
                assert check_integrity(b), "a partial bundle is visible at the target path"
            shutil.rmtree(target)
        if any(".staging-" in p.name for p in out.iterdir()):
            break  # a killed write's leftovers, for the next write to remove
    assert interrupted >= 1, "no kill landed while the bundle was being written"
    assert any(".staging-" in p.name for p in out.iterdir())
    written = write_bundle(run, out)  # the next write removes what the killed ones left
    assert sorted(p.name for p in out.iterdir()) == ["convnet-1.dossier"]
    with open_bundle(written.path) as b:
        assert check_integrity(b)


# ---------------------------------------------------------------------------------------- slow
@pytest.mark.slow
def test_release_of_the_full_convnet_sample(tmp_path: Path, samples_dir: Path) -> None:
    sample = samples_dir / "convnet"
    res = h.cli("release", sample / "release.toml", "--out", tmp_path / "out", "--quiet")
    assert res.exit_code == 0, res.stderr
    o = json.loads(h.cli("inspect", tmp_path / "out" / "convnet-1.dossier", "--json").stdout)
    assert sum(o["trials"].values()) >= 12 and o["strategy"] == "full"
    assert o["gain"] is (o["speedup"] is not None)
    assert h.cli("verify", tmp_path / "out" / "convnet-1.dossier",
                 "--integrity-only").exit_code == 0
