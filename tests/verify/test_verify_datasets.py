"""verify cross-checks a bundle's data-set records: datasets.json against the search record
and the files present. A bundle re-sealed after its hold-out folder was removed, or with hold-out
records that contradict each other or a loss that contradicts "passed", is not VALID."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from _bundles import reseal
from conftest import cli
from test_datasets import int8_release  # noqa: F401 - the fixture: one int8 release

FP = ("--host-fingerprint",)


def _copy(int8_release: Path, tmp_path: Path) -> Path:  # noqa: F811
    b = tmp_path / int8_release.name
    shutil.copytree(int8_release, b)
    return b


def _verify(b: Path) -> tuple[int, dict]:  # type: ignore[type-arg]
    fp = b / "fingerprint.json"
    r = cli("verify", b, "--host-fingerprint", fp, "--json")
    return r.exit_code, json.loads(r.stdout)


def _reasons(report: dict) -> str:  # type: ignore[type-arg]
    return " | ".join(f["reason"] for f in report["findings"] if f["field"].startswith("datasets"))


def test_the_int8_release_as_written_has_no_data_set_finding(int8_release: Path,  # noqa: F811
                                                             tmp_path: Path) -> None:
    code, report = _verify(_copy(int8_release, tmp_path))
    assert _reasons(report) == "" and code == 0, report


def test_a_removed_holdout_folder_is_a_finding(int8_release: Path,  # noqa: F811
                                              tmp_path: Path) -> None:
    b = _copy(int8_release, tmp_path)
    shutil.rmtree(b / "holdout")
    reseal(b, lambda m: m.update(files=[f for f in m["files"]
                                        if not f["path"].startswith("holdout/")]))
    code, report = _verify(b)
    assert code == 11 and report["verdict"] == "INVALID", report
    assert "holdout/ folder is gone" in _reasons(report)


@pytest.mark.parametrize("damage, said", [
    ("loss", "marked passed, but its loss 0.5 is at or above the threshold 0.001"),
    ("contradict", "contradictory hold-out records"),
    ("digest", "disagree on the holdout set"),
])
def test_contradictory_hold_out_records_are_findings(int8_release: Path,  # noqa: F811
                                                     tmp_path: Path, damage: str,
                                                     said: str) -> None:
    b = _copy(int8_release, tmp_path)
    record = json.loads((b / "datasets.json").read_text())
    if damage == "loss":  # passed, with a loss at the threshold and above, in both records
        record["holdout_check"]["worst_loss"] = 0.5
        lines = (b / "tuning-cache.jsonl").read_text().splitlines()
        edited = []
        for line in lines:
            rec = json.loads(line)
            if rec.get("kind") == "decision":
                rec["holdout"]["worst_loss"] = 0.5
                line = json.dumps(rec)
            edited.append(line)
        (b / "tuning-cache.jsonl").write_text("\n".join(edited) + "\n")
    elif damage == "contradict":
        record["holdout_check"]["passed"] = not record["holdout_check"]["passed"]
        record["holdout_check"]["reason"] = "crafted"
    else:
        for s in record["sets"]:
            if s["role"] == "holdout":
                s["digest"] = "0" * 32
    (b / "datasets.json").write_text(json.dumps(record))
    reseal(b)
    code, report = _verify(b)
    assert code == 11 and report["verdict"] == "INVALID", report
    assert said in _reasons(report), _reasons(report)
