"""``dossier diff A B``: exactly the fields that differ, across versions of one release and
across releases; environment changes with the policy's verdicts; exit 0 either way."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from test_explain import cli, make_bundle

from dossier.audit import BundleDiff, diff_bundles
from dossier.bundle import open_bundle, pack_bundle, write_bundle
from dossier.routes import Route
from dossier.verify.policy import Verdict


@pytest.fixture(scope="module")
def versions(tmp_path_factory: pytest.TempPathFactory, samples_dir: Path) -> tuple[Path, Path]:
    """One search bundled twice: as version 1, then (its cache header saying version 2) as
    version 2 with version 1 as its parent."""
    root = tmp_path_factory.mktemp("diff")
    v1 = make_bundle(root, samples_dir, "convnet", name="convnet", selection=(
        "-graph_optimization_level=basic -enable_mem_reuse=[on|off]"))
    run2 = root / "run-v2"
    shutil.copytree(v1.parent.parent / "run", run2)
    cache = run2 / "tuning-cache.jsonl"
    lines = cache.read_text().splitlines()
    header = json.loads(lines[0])
    header["spec"]["release"]["version"] = 2
    cache.write_text("\n".join([json.dumps(header), *lines[1:]]) + "\n")
    with open_bundle(v1) as b:
        parent = b.manifest.dossier_id
    v2 = write_bundle(run2, root / "out-v2", parent=parent).path
    return v1, v2


@pytest.fixture(scope="module")
def other(tmp_path_factory: pytest.TempPathFactory, samples_dir: Path) -> Path:
    """Another release of the same model: the level pinned to ``all`` instead of ``basic``."""
    return make_bundle(tmp_path_factory.mktemp("diff"), samples_dir, "convnet", name="convnet-b",
                       selection="-graph_optimization_level=all -enable_mem_reuse=[on|off]")


def _fields(d: BundleDiff) -> set[tuple[str, str]]:
    return {(c.section, c.field) for c in d.changes}


def test_two_versions_differ_in_exactly_version_parent_id_and_cache(
        versions: tuple[Path, Path]) -> None:
    v1, v2 = versions
    res = cli("diff", v1, v2, "--json")
    assert res.exit_code == 0, res.stderr
    d = BundleDiff.model_validate_json(res.stdout)
    assert _fields(d) == {("release", "release_version"), ("release", "dossier_id"),
                          ("release", "parent"), ("files", "tuning-cache.jsonl")}
    by = {c.field: c for c in d.changes}
    assert (by["release_version"].a, by["release_version"].b) == ("1", "2")
    assert by["parent"].a is None and by["parent"].b == d.a.dossier_id
    assert by["tuning-cache.jsonl"].note == "changed"
    assert d.relation == "B replaces A (A is B's parent); versions 1 -> 2 of convnet"
    assert d.differs and d.environment_verdict is Verdict.VALID
    assert all(not r.changed for r in d.winner) and d.winner  # same route, knob by knob
    # the text says the same, and exits 0 too
    res = cli("diff", v1, v2)
    assert res.exit_code == 0, res.stderr
    text = res.stdout
    assert "release_version: 1 -> 2" in text and "~ tuning-cache.jsonl  (changed)" in text
    assert "B replaces A" in text and "4 field(s) differ" in text
    assert "verdict for B's engine: VALID" in text


def test_a_bundle_against_itself_has_no_difference(versions: tuple[Path, Path],
                                                   tmp_path: Path) -> None:
    v1, _ = versions
    tar = pack_bundle(v1, tmp_path)  # the .dossier.tar is read like the folder
    res = cli("diff", v1, tar)
    assert res.exit_code == 0, res.stderr
    assert res.stdout.rstrip().endswith("no difference")
    d = BundleDiff.model_validate_json(cli("diff", v1, tar, "--json").stdout)
    assert not d.differs and d.changes == [] and d.relation == "the same bundle"


def test_across_releases_the_winner_is_compared_knob_by_knob(versions: tuple[Path, Path],
                                                             other: Path) -> None:
    v1, _ = versions
    res = cli("diff", v1, other, "--json")
    assert res.exit_code == 0, res.stderr
    d = BundleDiff.model_validate_json(res.stdout)
    with open_bundle(v1) as a, open_bundle(other) as b:
        ra = Route.parse(a.manifest.summary.shipped_route).as_dict()
        rb = Route.parse(b.manifest.summary.shipped_route).as_dict()
        expected = diff_bundles(a, b)
        ma, mb = a.manifest, b.manifest
    assert d == expected.model_copy(update={"a": d.a, "b": d.b})
    assert ra["graph_optimization_level"] == "basic" and rb["graph_optimization_level"] == "all"
    winner = {c.field for c in d.changes if c.section == "winner"}
    assert winner == {k for k in ra if ra[k] != rb.get(k)}
    assert "graph_optimization_level" in winner
    assert [(r.knob, r.a, r.b, r.changed) for r in d.winner] == [
        (k, ra[k], rb[k], ra[k] != rb[k]) for k in sorted(ra)]
    release = {c.field for c in d.changes if c.section == "release"}
    assert {"release", "dossier_id"} <= release and "parent" not in release
    assert d.relation == ("neither names the other as its parent; different releases "
                          "(convnet and convnet-b)")
    # accuracy of the shipped route: the worst loss, from each bundle's routes table
    assert (d.a.worst_loss, d.b.worst_loss) == (_worst(v1, ma.summary.shipped_index),
                                                _worst(other, mb.summary.shipped_index))
    if d.a.worst_loss != d.b.worst_loss:
        assert ("accuracy", "worst_loss") in _fields(d)
    files = {c.field: c.note for c in d.changes if c.section == "files"}
    assert files["engine/convnet.ort"] == "removed" and files["engine/convnet-b.ort"] == "added"
    text = cli("diff", v1, other).stdout
    assert "graph_optimization_level  basic -> all  changed" in text


def _worst(bundle: Path, index: int) -> float | None:
    with open_bundle(bundle) as b:
        rows = b.routes().select(["index", "worst_loss"]).to_pylist()
    return next(r["worst_loss"] for r in rows if r["index"] == index)


def test_environment_changes_carry_the_policys_verdicts(versions: tuple[Path, Path],
                                                        tmp_path: Path) -> None:
    v1, v2 = versions
    moved = tmp_path / v2.name
    shutil.copytree(v2, moved)
    fp = json.loads((moved / "fingerprint.json").read_text())
    fp["cpu"]["cores"] = 64
    fp["packages"]["onnxruntime"] = "0.0.1"
    fp["hostname"] = "elsewhere"
    (moved / "fingerprint.json").write_text(json.dumps(fp))
    res = cli("diff", v1, moved, "--json")
    assert res.exit_code == 0, res.stderr  # differences are reported, never an error
    d = BundleDiff.model_validate_json(res.stdout)
    env = {c.field: c for c in d.changes if c.section == "environment"}
    assert set(env) == {"cpu.cores", "packages.onnxruntime", "hostname"}
    assert env["packages.onnxruntime"].verdict is Verdict.INVALID
    assert env["cpu.cores"].verdict is Verdict.SUBOPTIMAL
    assert env["hostname"].verdict is Verdict.VALID
    assert (env["cpu.cores"].a, env["cpu.cores"].b) == (str(fp_cores(v1)), "64")
    assert "ONNX Runtime version" in (env["packages.onnxruntime"].note or "")
    assert d.environment_verdict is Verdict.INVALID
    assert "the default verify policy of onnxruntime" in d.policy_note
    text = cli("diff", v1, moved).stdout
    assert "packages.onnxruntime:" in text and "INVALID" in text


def fp_cores(bundle: Path) -> int:
    return int(json.loads((bundle / "fingerprint.json").read_text())["cpu"]["cores"])


def test_diff_of_what_is_not_a_bundle_is_refused(versions: tuple[Path, Path],
                                                 tmp_path: Path) -> None:
    res = cli("diff", versions[0], tmp_path / "missing")
    assert res.exit_code == 6 and "not a bundle" in res.stderr
