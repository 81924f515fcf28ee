"""The H200 summary's re-decision of recorded searches with today's rule, on the raw files
kept in bench/results/h200-raw (tag f2: four calibration searches of ResNet-50 b1 confirmed in
3 process generations, one shipped as recorded)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
RAW = ROOT / "bench" / "results" / "h200-raw"


@pytest.fixture(scope="module")
def summary():  # type: ignore[no-untyped-def]
    spec = importlib.util.spec_from_file_location("h200_summarize",
                                                  ROOT / "bench" / "h200" / "summarize.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_search_over_more_knobs_reaches_full_when_it_agrees_on_fulls_knobs(summary) -> None:  # type: ignore[no-untyped-def]
    best = "-cuda_graph=on -inductor:freezing=false"
    assert summary.reaches("-cuda_graph=on -inductor:coordinate_descent_tuning=false "
                           "-inductor:freezing=false", best)
    assert not summary.reaches("-cuda_graph=off -inductor:freezing=false", best)
    assert not summary.reaches("-cuda_graph=on", best)  # a knob of full's answer left unset


def test_recorded_searches_are_re_decided_from_their_rounds(summary) -> None:  # type: ignore[no-untyped-def]
    doc = json.loads((RAW / "h200-f2.json").read_text())
    doc["_file"] = str(RAW / "h200-f2.json")
    runs = {r["rep"]: r for s in doc["steps"] if s.get("step") == "calib" for r in s["runs"]}
    got = {rep: summary._reanalyse(doc, f"resnet50_b1-calib-{rep:02d}", {
        "route": r.get("shipped_route"), "speedup": (r.get("fresh") or {}).get("fresh_speedup")})
        for rep, r in runs.items()}
    # as recorded only rep 2 shipped; under the A/A's bias interval reps 0, 2 and 3 ship with
    # the interval they recorded (a candidate's interval did not change), rep 1 still does not
    assert [runs[i]["gain"] for i in range(4)] == [False, False, True, False]
    assert [got[i]["gain"] for i in range(4)] == [True, False, True, True]
    assert got[2]["speedup_ci"] == pytest.approx(runs[2]["speedup_ci"])
    assert got[2]["fresh_inside"] is True and got[0]["fresh_inside"] is None
    assert "does not clear the confirmation A/A reading's upper end" in got[1]["reason"]
    assert all(got[i]["excludes_one"] for i in (0, 2, 3))
    # a search confirmed in one generation is not re-decided
    assert summary._reanalyse(doc, "resnet50_b1-calib-00", None, processes=1) is None
