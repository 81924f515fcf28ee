"""The H200 summary's re-decision of recorded searches with today's rule, on the raw files
kept in bench/results/h200-raw (tag f2: four calibration searches of ResNet-50 b1 confirmed in
3 process generations, one shipped as recorded)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
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


def test_recorded_searches_are_reported_as_decided_not_re_decided(summary) -> None:  # type: ignore[no-untyped-def]
    """The kept H200 searches confirmed with one process per engine; today's rule pairs the
    engines inside each measuring process, a measurement those records do not hold, so they are
    not re-decided (and the summary still reads them)."""
    doc = json.loads((RAW / "h200-f2.json").read_text())
    doc["_file"] = str(RAW / "h200-f2.json")
    runs = [r for s in doc["steps"] if s.get("step") == "calib" for r in s["runs"]]
    assert runs and all(summary._reanalyse(doc, f"resnet50_b1-calib-{r['rep']:02d}", None) is None
                        for r in runs)
