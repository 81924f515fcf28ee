"""What inspect and explain say of a release's data sets: the sets with size and digest, the
hold-out check with its loss, a warning for a route that changes the numbers with no hold-out
set, the wording after a hold-out rejection, and latencies named so that nobody reads a
sample's figure as an inference's."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from conftest import cli

from dossier.audit.explain import explain, explain_search
from dossier.bundle import open_bundle
from dossier.cache import HoldoutRecord
from dossier.datasets import HOLDOUT_REJECTED, decision_result, numeric_changes
from dossier.formats import get_format
from dossier.knobs import KnobDatabase
from dossier.trial import Outcome

GOLDEN = Path(__file__).parents[1] / "assets" / "golden" / "convnet-1.dossier"
FASTER = "-graph_optimization_level=disable_all"


def _precision_bundle(tmp_path: Path) -> Path:
    """The golden bundle as if its shipped route changed the numbers: knobs.json marks the
    knob it varies as one that does, and the manifest names the other value as shipped."""
    b = tmp_path / "convnet-1.dossier"
    shutil.copytree(GOLDEN, b)
    knobs = json.loads((b / "knobs.json").read_text())
    for k in knobs["knobs"]:
        if k["name"] == "graph_optimization_level":
            k["changes_numerics"] = True
    (b / "knobs.json").write_text(json.dumps(knobs))
    m = json.loads((b / "manifest.json").read_text())
    m["summary"]["shipped_route"] = FASTER
    (b / "manifest.json").write_text(json.dumps(m))
    return b


def test_numeric_changes_name_the_knobs_that_change_the_numbers() -> None:
    db = KnobDatabase.model_validate_json((GOLDEN / "knobs.json").read_text())
    assert numeric_changes(FASTER, "-graph_optimization_level=all", db) == []
    marked = db.model_copy(update={"knobs": tuple(
        k.model_copy(update={"changes_numerics": k.name == "graph_optimization_level"})
        for k in db.knobs)})
    assert numeric_changes(FASTER, "-graph_optimization_level=all", marked) == [
        "graph_optimization_level=disable_all"]
    assert numeric_changes("-graph_optimization_level=all", "-graph_optimization_level=all",
                           marked) == []


def test_a_precision_route_without_a_hold_out_set_is_warned_in_inspect_and_explain(
        tmp_path: Path) -> None:
    b = _precision_bundle(tmp_path)
    r = cli("inspect", b)
    assert r.exit_code == 0, r.output
    assert "graph_optimization_level=disable_all) and no hold-out set checked it" in r.stdout
    doc = json.loads(cli("inspect", b, "--json").stdout)
    assert any("no hold-out set checked it" in w for w in doc["warnings"])
    r = cli("explain", b)
    assert r.exit_code == 0, r.output
    assert "warning: the shipped route changes the numbers" in r.stdout
    # the golden bundle as it is (the baseline ships): no such warning
    assert "no hold-out set checked it" not in cli("inspect", GOLDEN).stdout
    assert "no hold-out set checked it" not in cli("explain", GOLDEN).stdout


def test_inspect_shows_the_data_sets_with_size_and_digest(tmp_path: Path) -> None:
    r = cli("inspect", GOLDEN)
    assert r.exit_code == 0, r.output
    with open_bundle(GOLDEN) as bundle:
        digest = bundle.tuning_cache().header.validation_digest
    assert f"validation 3 pair(s), xxh3-128 {digest} (in validation/)" in r.stdout
    assert "hold-out     none: no hold-out set checked the shipped route" in r.stdout
    doc = json.loads(cli("inspect", GOLDEN, "--json").stdout)
    assert doc["data_sets"] == [{"role": "validation", "size": 3, "digest": digest,
                                 "in_bundle": "validation"}]
    assert doc["holdout_check"] is None


def test_inspect_shows_the_hold_out_check_with_its_loss(tmp_path: Path) -> None:
    """A bundle whose search checked the shipped route on a hold-out set of 2 pairs."""
    b = tmp_path / "convnet-1.dossier"
    shutil.copytree(GOLDEN, b)
    lines = (b / "tuning-cache.jsonl").read_text().splitlines()
    header, records = json.loads(lines[0]), [json.loads(x) for x in lines[1:]]
    header["holdout"] = {"role": "holdout", "digest": "ab" * 16, "size": 2, "path": "/h"}
    for rec in records:
        if rec["kind"] == "decision":
            rec["holdout"] = HoldoutRecord(
                route=rec["shipped_route"], trial_index=0, passed=True, worst_loss=2.5e-5,
                pairs=2, losses={"pair-000": {"logits": 2.5e-5}}).model_dump(mode="json")
    (b / "tuning-cache.jsonl").write_text(
        "\n".join(json.dumps(x) for x in [header, *records]) + "\n")
    r = cli("inspect", b)
    assert r.exit_code == 0, r.output
    assert f"hold-out {2} pair(s), xxh3-128 {'ab' * 16} (not in the bundle)" in r.stdout
    assert ("hold-out     passed: -graph_optimization_level=all, worst linf loss 2.5e-05 < "
            "0.0001 on 2 pair(s)") in r.stdout, r.stdout
    doc = json.loads(cli("inspect", b, "--json").stdout)
    assert doc["holdout_check"]["worst_loss"] == 2.5e-5 and doc["holdout_check"]["passed"]


def test_after_a_hold_out_rejection_the_headline_says_what_happened() -> None:
    with open_bundle(GOLDEN) as bundle:
        cache = bundle.tuning_cache()
        decision = cache.decision
        assert decision is not None
        rejected = decision.model_copy(update={"holdout_rejected": [FASTER]})
        trials = [t.model_copy(update={"outcome": Outcome.REJECTED}) if t.route == FASTER
                  else t for t in cache.trials]
        assert decision_result(rejected) == HOLDOUT_REJECTED
        assert decision_result(decision) == "no significant gain"
        e = explain_search(cache.header, trials, cache.sessions, rejected,
                           manifest=bundle.manifest)
    assert e.decision.result == HOLDOUT_REJECTED
    text = get_format("text").explanation(e)
    head = text.splitlines()[1]
    assert head.startswith(HOLDOUT_REJECTED) and "no significant gain" not in head, head
    assert f"**{HOLDOUT_REJECTED}**" in get_format("markdown").explanation(e)
    effect = next(x for x in text.splitlines() if "all -> disable_all" in x)
    assert "rejected (accuracy)" in effect and "no significant effect" not in effect, effect
    assert "slower" not in effect  # the verdict is the rejection, not the speed
    assert "[0.069, 0.625]" in effect  # the interval is the one measured


def test_inspect_names_its_latencies_median_and_per_sample() -> None:
    r = cli("inspect", GOLDEN)
    line = next(x for x in r.stdout.splitlines() if x.strip().startswith("baseline"))
    assert "median 0.1856 ms per inference" in line, line
    doc = json.loads(cli("inspect", GOLDEN, "--json").stdout)
    b = doc["baseline"]
    assert "median_ms" not in b and b["inferences_per_sample"] == 3
    assert b["sample_median_ms"] == pytest.approx(0.5567315)
    assert doc["baseline_latency"]["median_ms"] == pytest.approx(0.5567315 / 3, rel=0.3)


def test_explain_of_an_old_bundle_reads_as_before() -> None:
    with open_bundle(GOLDEN) as bundle:
        e = explain(bundle)
    assert e.warnings == [] and e.decision.result == "no significant gain"


def test_a_release_records_and_prints_the_warning(rel: dict, tmp_path: Path,  # type: ignore[type-arg]
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """The bundle writer asks which knobs of the shipped route change the numbers (stubbed
    here to say quantization: the samples' releases ship float32) and, with no hold-out set in
    the search, records the warning in the manifest, which release and bundle print."""
    import dossier.bundle.writer as writer

    run = tmp_path / "run"
    shutil.copytree(rel["convnet"].run, run)
    monkeypatch.setattr(writer, "numeric_changes", lambda *a: ["quantization=dynamic"])
    r = cli("bundle", run, "--out", tmp_path / "out")
    assert r.exit_code == 0, r.output
    assert "warning: the shipped route changes the numbers (quantization=dynamic) and no " \
        "hold-out set checked it" in " ".join(r.stderr.split())
    m = json.loads(next((tmp_path / "out").glob("*.dossier")).joinpath("manifest.json")
                   .read_text())
    assert any("no hold-out set checked it" in w for w in m["warnings"])
