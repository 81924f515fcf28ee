"""The HTML report's latency chart as a person sees it, in a real headless Chromium at two
widths: the y-axis title is drawn whole inside the figure (not clipped), and no annotation
overlaps another text of the chart (axis titles, the legend, other annotations) or leaves the
figure."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from test_explain import cli, make_bundle
from test_report_browser import CHROMIUM, Browser

pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(not CHROMIUM.is_file(), reason="no headless chromium at /usr/bin/chromium "
                       "(apt-get install chromium)"),
]

LAYOUT = """(() => {
  const plot = document.getElementById('plot-latency');
  const box = e => { const r = e.getBoundingClientRect();
                     return {l: r.left, t: r.top, r: r.right, b: r.bottom, text: e.textContent}; };
  const svg = plot.querySelector('svg.main-svg');
  return {svg: box(svg),
          ytitle: Array.from(plot.querySelectorAll('.g-ytitle text')).map(box),
          xtitle: Array.from(plot.querySelectorAll('.g-xtitle text')).map(box),
          legend: Array.from(plot.querySelectorAll('.legend .legendtext')).map(box),
          notes: Array.from(plot.querySelectorAll('.annotation-text')).map(box)};
})()"""


def _inside(a: dict[str, Any], outer: dict[str, Any]) -> bool:
    return (a["l"] >= outer["l"] - 0.5 and a["r"] <= outer["r"] + 0.5
            and a["t"] >= outer["t"] - 0.5 and a["b"] <= outer["b"] + 0.5)


def _overlap(a: dict[str, Any], b: dict[str, Any]) -> bool:
    return a["l"] < b["r"] and b["l"] < a["r"] and a["t"] < b["b"] and b["t"] < a["b"]


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory, samples_dir: Path) -> Path:
    pytest.importorskip("plotly", reason="the report extra (plotly) is not installed")
    folder = tmp_path_factory.mktemp("chart")
    bundle = make_bundle(folder, samples_dir, "faulty")
    page = folder / "report.html"
    assert cli("explain", bundle, "--html", page).exit_code == 0
    return page


@pytest.mark.parametrize("width", [1400, 700])
def test_the_latency_chart_fits_its_texts_at_two_widths(report: Path, width: int) -> None:
    browser = Browser()
    try:
        browser.open(report)
        browser.call("Emulation.setDeviceMetricsOverride", {
            "width": width, "height": 900, "deviceScaleFactor": 1, "mobile": False})
        browser.eval("window.dispatchEvent(new Event('resize')); 0")
        browser.settle(1.0)
        got = browser.eval(LAYOUT)
        assert browser.errors() == []
    finally:
        browser.close()
    svg = got["svg"]
    assert got["ytitle"], "the latency chart has no y-axis title"
    for t in got["ytitle"] + got["xtitle"]:
        assert _inside(t, svg), (width, "axis title clipped", t, svg)
    others = got["ytitle"] + got["xtitle"] + got["legend"]
    for i, note in enumerate(got["notes"]):
        assert _inside(note, svg), (width, "annotation outside the figure", note, svg)
        for other in others + got["notes"][i + 1:]:
            assert not _overlap(note, other), (width, "annotation overlaps", note, other)
