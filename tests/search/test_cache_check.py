"""Crafted tuning caches: ``tune --continue`` and ``bundle`` check every record against the
header, the knob database and the run folder before using it, and refuse in one line naming the
line (exit 3), writing nothing.

Each case edits a copy of a finished run folder of the convnet sample (header, baseline,
one search trial, the decision, one session) the way a hostile or careless hand would.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import _bundles as h
import pytest
from _figures import figures

from dossier.errors import ExitCode
from dossier.hashing import digest_file
from dossier.lock import RUN_LOCK
from dossier.run_folder import CACHE_NAME

Records = list[dict[str, Any]]
PASSWD = Path("/etc/passwd")


def _trial(records: Records, index: int) -> dict[str, Any]:
    return next(r for r in records if r["kind"] == "trial" and r["index"] == index)


def _set(which: int, **fields: Any) -> Callable[[Records, Path, dict], None]:
    def edit(records: Records, run: Path, rel: dict) -> None:
        _trial(records, which).update(fields)
    return edit


def _drop_pair_losses(which: int) -> Callable[[Records, Path, dict], None]:
    def edit(records: Records, run: Path, rel: dict) -> None:
        trial = _trial(records, which)
        assert trial["outcome"] == "ok" and trial["losses"]
        del trial["losses"][sorted(trial["losses"])[0]]
    return edit


def _every_round(which: int) -> Callable[[Records, Path, dict], None]:
    """The trial says it raced out and has its samples spread over all 6 rounds (whether it
    raced or not: on a loaded host it may time every round): a trial that timed every round
    did not race."""
    def edit(records: Records, run: Path, rel: dict) -> None:
        trial = _trial(records, which)
        assert trial["sample_rounds"] and records[0]["spec"]["timing"]["rounds"] == 6
        trial["raced"] = trial["raced"] or "raced out after 3 of 6 rounds: crafted"
        for key in ("sample_rounds", "baseline_sample_rounds"):
            n = len(trial[key])
            trial[key] = [i * 6 // n for i in range(n)]
    return edit


def _outside_engine(path: str) -> Callable[[Records, Path, dict], None]:
    def edit(records: Records, run: Path, rel: dict) -> None:
        _trial(records, 0).update(engine=path, engine_digest=digest_file(PASSWD)[0])
    return edit


def _symlink_out(records: Records, run: Path, rel: dict) -> None:
    engine = run / _trial(records, 0)["engine"]
    engine.unlink()
    os.symlink(PASSWD, engine)
    _trial(records, 0)["engine_digest"] = digest_file(PASSWD)[0]


def _engine_changed(records: Records, run: Path, rel: dict) -> None:
    engine = run / _trial(records, 1)["engine"]
    data = bytearray(engine.read_bytes())
    data[len(data) // 2] ^= 0xFF
    engine.write_bytes(bytes(data))


def _move(kind: str, to: int) -> Callable[[Records, Path, dict], None]:
    def edit(records: Records, run: Path, rel: dict) -> None:
        record = next(r for r in records if r["kind"] == kind)
        records.remove(record)
        records.insert(to, record)
    return edit


def _repeat(line: int) -> Callable[[Records, Path, dict], None]:
    def edit(records: Records, run: Path, rel: dict) -> None:
        records.insert(line, dict(records[line - 1]))
    return edit


def _set_decision(**fields: Any) -> Callable[[Records, Path, dict], None]:
    def edit(records: Records, run: Path, rel: dict) -> None:
        next(r for r in records if r.get("kind") == "decision").update(fields)
    return edit


def _repeat_decision(records: Records, run: Path, rel: dict) -> None:
    at = next(i for i, r in enumerate(records) if r.get("kind") == "decision")
    records.insert(at + 1, dict(records[at]))


def _scenario_decision_of_another_engine(records: Records, run: Path, rel: dict) -> None:
    at = next(i for i, r in enumerate(records) if r.get("kind") == "decision")
    first = records[at]
    trials = [r for r in records if r.get("kind") == "trial"]
    shipped = trials[first["shipped_index"]]
    other = next(t for t in trials if t.get("engine_digest") and t["outcome"] == "ok"
                 and t["engine_digest"] != shipped["engine_digest"])
    records.insert(at + 1, {**first, "scenario": True, "shipped_index": other["index"],
                            "shipped_route": other["route"]})


def _other_header(records: Records, run: Path, rel: dict) -> None:
    lines = (rel["tblock"].run / CACHE_NAME).read_text().splitlines()
    records[0] = json.loads(lines[0])


def _header(**fields: Any) -> Callable[[Records, Path, dict], None]:
    def edit(records: Records, run: Path, rel: dict) -> None:
        for key, value in fields.items():
            target = records[0]
            *path, last = key.split(".")
            for p in path:
                target = target[p]
            target[last] = value
    return edit


CASES: dict[str, tuple[Callable[[Records, Path, dict], None], str]] = {
    # (edit, what the one line must say); line numbers count the header as line 1
    "engine ../../etc/passwd with its digest": (
        _outside_engine("../../../../../../../../../etc/passwd"),
        "line 2: engine path '../../../../../../../../../etc/passwd' is not a plain path"),
    "engine /etc/passwd with its digest": (_outside_engine(str(PASSWD)),
                                           "line 2: engine path '/etc/passwd' is not a plain"),
    "engine a symbolic link out of the run folder": (_symlink_out,
                                                     "leads out of the run folder"),
    "engine changed since the search": (_engine_changed, "line 3: engine 'engines/"),
    "admissible trial without an engine digest": (_set(1, engine_digest=None),
                                                  "line 3: engine 'engines/trial-0001.ort' has no "
                                                  "digest"),
    "route outside the selection": (_set(1, route="-graph_optimization_level=basic"),
                                    "line 3: route '-graph_optimization_level=basic' lies "
                                    "outside the selection"),
    "unknown knob": (_set(1, route="-graph_optimization_level=disable_all -no_such_knob=1"),
                     "line 3: route"),
    "duplicated trial line": (_repeat(3), "line 4: trial index 1 where 2 was expected"),
    "duplicated index": (_set(1, index=0), "line 3: trial index 0 where 1 was expected"),
    "two baselines": (_set(1, role="baseline"), "line 3: the baseline must be trial 0"),
    "no baseline at index 0": (_set(0, role="search"), "line 2: trial 0 is a search trial"),
    "decision placed first": (_move("decision", 1), "line 2: a decision before any trial"),
    "decision between the trials": (_move("decision", 2),
                                    "line 4: trial 1 comes after the decision on line 3"),
    "second decision": (_repeat_decision, "a second decision"),
    "a scenario's decision shipping another engine": (
        _scenario_decision_of_another_engine, "is not a serving configuration of the engine"),
    "a scenario's decision alone": (_set_decision(scenario=True),
                                    "a scenario's decision without the single-stream decision"),
    "losses of outputs the model does not have": (
        _set(1, losses={"pair-000": {"not_an_output": 0.0}}),
        "line 3: losses of trial 1 name output 'not_an_output'"),
    "an ok trial with one pair's losses deleted": (
        _drop_pair_losses(1), "line 3: trial 1 is recorded ok without the loss of output"),
    "header of another model (tblock) over these trials": (_other_header, "line 2: losses of "
                                                           "trial 0 name output"),
    "raced out, yet timed every round": (_every_round(1),
                                         "line 3: trial 1 says it raced out, yet timed 6 rounds"),
    "the baseline raced out": (_set(0, raced="crafted"),
                               "line 2: trial 0 is a baseline trial and says it raced out"),
    "header's inferences per sample not its validation set's": (
        _header(inferences_per_sample=7),
        "line 1: the header says a timed sample is 7 inference(s); with timing.inputs = "
        "'shapes' its validation set gives 3"),
    "header's model digest not the model's": (_header(**{"model.digest": "0" * 32}),
                                              "model"),
    "header's validation digest not the set's": (_header(validation_digest="0" * 32),
                                                 "validation set"),
}


def _crafted(rel: dict[str, h.Released], tmp_path: Path, case: str) -> Path:
    run = tmp_path / "run"
    shutil.copytree(rel["convnet"].run, run, symlinks=True)
    cache = run / CACHE_NAME
    records = [json.loads(line) for line in cache.read_text().splitlines()]
    CASES[case][0](records, run, rel)
    cache.write_text("".join(json.dumps(r) + "\n" for r in records))
    return run


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_crafted_cache_is_refused_naming_the_line(rel: dict[str, h.Released], tmp_path: Path,
                                                    case: str) -> None:
    run = _crafted(rel, tmp_path, case)
    expected = CASES[case][1]
    before = h.snapshot(run)
    out = tmp_path / "out"
    res = h.cli("bundle", run, "--out", out)
    assert res.exit_code == ExitCode.INPUT, (case, res.stderr)
    assert res.stderr.count("error:") == 1 and expected in h.said(res), (case, h.said(res))
    assert not out.exists() or not any(out.iterdir())  # nothing bundled, /etc/passwd least of all
    res = h.cli("tune", "--continue", run, "--quiet")
    assert res.exit_code == ExitCode.INPUT, (case, res.stderr)
    assert res.stderr.count("error:") == 1 and expected in h.said(res), (case, h.said(res))
    assert h.snapshot(run) == before  # no trial run, nothing appended, the lock removed
    assert not (run / RUN_LOCK).exists()


def test_crafted_cache_cases_counted() -> None:
    """docs/reliability.md says how many crafted caches are refused: the cases here."""
    page = (h.REPO / "docs" / "reliability.md").read_text(encoding="utf-8")
    said = re.findall(r"(\d+) crafted caches", page)
    assert said == [str(len(CASES))], (said, len(CASES))
    figures("crafted tuning caches refused by tune --continue and bundle", cases=len(CASES),
            commands=2, refused=2 * len(CASES))


def test_the_unedited_run_still_resumes_and_bundles(rel: dict[str, h.Released],
                                                   tmp_path: Path) -> None:
    """The checks refuse the crafted caches, not the honest one."""
    run = tmp_path / "run"
    shutil.copytree(rel["convnet"].run, run, symlinks=True)
    res = h.cli("tune", "--continue", run, "--quiet")
    assert res.exit_code == 0, h.said(res)
    res = h.cli("bundle", run, "--out", tmp_path / "out")
    assert res.exit_code == 0, h.said(res)


def test_the_golden_format_1_header_reads_as_the_spec_it_flattened() -> None:
    """A format 1 header (the spec's settings as flat fields) reads into the format 2 model."""
    from dossier.cache import TuningCache
    from dossier.measure.timing import RETIRED

    path = h.GOLDEN / CACHE_NAME
    flat = json.loads(path.read_text().split("\n")[0])
    assert flat["cache_format"] == 1
    spec = TuningCache.open(path).header.spec
    assert (spec.release.name, spec.release.version, spec.release.description) == \
        (flat["release"], flat["release_version"], flat["description"])
    assert (spec.model.path, spec.validation.path) == (flat["model"]["path"], flat["validation_path"])
    tune = spec.tune.model_dump()
    named = ("backend", "strategy", "selection", "metric", "threshold", "atol", "rtol")
    assert {k: tune[k] for k in named} == {k: flat[k] for k in named}
    assert {k: v for k, v in tune.items() if k not in named} == \
        type(spec.tune).model_construct().model_dump(include=set(tune) - set(named))
    kept = {k: v for k, v in flat["timing"].items() if k not in RETIRED}  # read, then dropped
    assert spec.timing.model_dump(mode="json") == {**spec.timing.model_dump(mode="json"), **kept}
    assert [s.model_dump() for s in spec.shapes] == flat["shapes"]
    assert spec.deployment.model_dump() == flat["deployment"] and spec.builder == flat["builder"]
