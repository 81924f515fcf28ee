"""The scenario as ``explain`` shows it: the latency-throughput curve of every configuration
measured (Triton Model Analyzer's chart: throughput across, the bound's percentile latency up),
the bound, the shipped point, and why the single-stream choice won or lost under the scenario.

:func:`facts` reads a :class:`~dossier.scenarios.decide.ScenarioDecision` into
:class:`ScenarioFacts` (plain numbers, part of ``explain --json``); :func:`chart` draws them in
text, :func:`figure` with plotly for the HTML report.
"""

from __future__ import annotations

import math
import statistics
from typing import Any

from pydantic import BaseModel, ConfigDict

from dossier.scenarios.models import AA, ScenarioDecision

REPORTED = (50.0, 90.0, 95.0, 97.0, 99.0, 99.9)
"""The percentiles LoadGen's log reports."""


class CurvePoint(BaseModel):
    """One LoadGen run: the rate completed and the latency at the bound's percentile."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    config: str
    """The configuration."""
    qps: float
    """Samples completed per second (the rate asked when LoadGen did not say)."""
    latency_ms: float | None
    """Latency at :attr:`ScenarioFacts.percentile_shown` (None: not reported)."""
    met: bool
    """The bound held at this rate (dossier's reading)."""


class ScenarioFacts(BaseModel):
    """The scenario's decision, for ``explain``."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    scenario: str
    """The scenario in one line."""
    bound_ms: float | None
    """The latency bound (server)."""
    percentile: float
    """The bound's percentile."""
    percentile_shown: float
    """The percentile the curve shows (the nearest LoadGen reports at or above it)."""
    baseline: str
    """The single-stream decision's choice."""
    shipped: str
    """The configuration that ships under the scenario."""
    metric_qps: dict[str, float]
    """Each configuration's median metric over the repetitions."""
    points: list[CurvePoint]
    """Every LoadGen run, by configuration."""
    why: str
    """Why the single-stream choice won or lost under the scenario."""


def _shown(percentile: float) -> float:
    return next((p for p in REPORTED if p >= percentile - 1e-9), REPORTED[-1])


def facts(decision: ScenarioDecision) -> ScenarioFacts:
    """The facts ``explain`` shows of a scenario decision."""
    s = decision.scenario
    shown = _shown(s.percentile)
    points = []
    for reading in decision.readings:
        if reading.name == AA:
            continue
        for result in reading.results:
            for p in result.probes:
                if p.run is None:
                    continue
                points.append(CurvePoint(config=reading.name, qps=p.run.completed_qps or p.qps,
                                         latency_ms=p.run.latency_ms(f"{shown:.2f}"), met=p.met))
    metric = {r.name: statistics.median(r.metric_qps) for r in decision.readings
              if r.metric_qps and r.name != AA}
    base = decision.baseline
    if decision.shipped == base:
        tried = [v for v in decision.verdicts if v.name != AA]
        why = (f"the single-stream choice ships: {base} met {metric.get(base, 0):.4g} QPS "
               "(median over repetitions)"
               + ("; no serving configuration served significantly more than it ("
                  + "; ".join(f"{v.name}: " + (f"{v.ratio:.3g}x [{v.low:.3g}, {v.high:.3g}]"
                                               if v.ratio is not None else v.reason)
                              for v in tried) + ")" if tried else
                  "; no other serving configuration of its engine was searched"))
    else:
        v = next(x for x in decision.verdicts if x.name == decision.shipped)
        why = (f"the single-stream choice lost under the scenario: {decision.shipped} served "
               f"{v.ratio:.3g}x [{v.low:.3g}, {v.high:.3g}] the QPS of {base} "
               f"({metric.get(decision.shipped, 0):.4g} against {metric.get(base, 0):.4g} QPS, "
               f"p={v.p_value:.2g} at level {v.level:.2g})")
    return ScenarioFacts(scenario=s.describe(), bound_ms=s.latency_ms, percentile=s.percentile,
                         percentile_shown=shown, baseline=base, shipped=decision.shipped,
                         metric_qps=metric, points=points, why=why)


WIDTH, HEIGHT = 60, 14
MARKS = "ABCDEFGHIJ"


def chart(f: ScenarioFacts) -> list[str]:
    """The curve in text: throughput across, latency up (log scale), one letter per
    configuration (lower case where the bound did not hold), ``-`` the bound, ``*`` the shipped
    point; then the legend."""
    pts = [p for p in f.points if p.latency_ms is not None and p.latency_ms > 0 and p.qps > 0]
    names = list(dict.fromkeys(p.config for p in f.points))
    legend = [f"  {MARKS[i % len(MARKS)]}: {n}" + (" (ships)" if n == f.shipped else "")
              + (" (single-stream choice)" if n == f.baseline else "")
              + f": {f.metric_qps.get(n, 0):.4g} QPS" for i, n in enumerate(names)]
    if not pts:
        return ["  (no LoadGen run reported a latency)", *legend]
    lat = [p.latency_ms for p in pts if p.latency_ms]
    lows = [*lat, *([f.bound_ms] if f.bound_ms else [])]
    lo, hi = math.log10(min(lows)), math.log10(max([*lat, *([f.bound_ms] if f.bound_ms else [])]))
    hi = hi if hi > lo else lo + 1
    qmax = max(p.qps for p in pts) * 1.05
    grid = [[" "] * WIDTH for _ in range(HEIGHT)]

    def row(ms: float) -> int:
        return HEIGHT - 1 - round((math.log10(ms) - lo) / (hi - lo) * (HEIGHT - 1))

    if f.bound_ms:
        for x in range(WIDTH):
            grid[row(f.bound_ms)][x] = "-"
    for p in pts:
        mark = MARKS[names.index(p.config) % len(MARKS)]
        grid[row(p.latency_ms or 1)][min(WIDTH - 1, round(p.qps / qmax * (WIDTH - 1)))] = \
            mark if p.met else mark.lower()
    ship = f.metric_qps.get(f.shipped)
    at = [p for p in pts if p.config == f.shipped and p.met]
    if ship and at:
        best = min(at, key=lambda p: abs(p.qps - ship))
        grid[row(best.latency_ms or 1)][min(WIDTH - 1, round(best.qps / qmax * (WIDTH - 1)))] = "*"
    out = [f"  p{f.percentile_shown:g} latency (ms, log scale) against QPS completed"
           + (f"; bound {f.bound_ms:g} ms at p{f.percentile:g} (-)" if f.bound_ms else "")]
    for i, cells in enumerate(grid):
        label = f"{10 ** (hi - i / (HEIGHT - 1) * (hi - lo)):8.3g} |" if i % 4 == 0 or \
            i == HEIGHT - 1 else "         |"
        out.append(f"  {label}{''.join(cells).rstrip()}")
    out.append("           +" + "-" * WIDTH)
    out.append(f"            0{'':{WIDTH - 12}}{qmax:>10.4g} QPS")
    return [*out, *legend]


def figure(go: Any, f: ScenarioFacts) -> Any:
    """The curve as a plotly figure: a line per configuration through its runs in order of
    rate, hollow where the bound did not hold, the bound as a dashed line, the shipped point
    starred."""
    fig = go.Figure()
    for name in dict.fromkeys(p.config for p in f.points):
        pts = sorted((p for p in f.points if p.config == name and p.latency_ms is not None),
                     key=lambda p: p.qps)
        fig.add_trace(go.Scatter(
            x=[p.qps for p in pts], y=[p.latency_ms for p in pts], mode="lines+markers",
            name=name + (" (ships)" if name == f.shipped else ""),
            marker=dict(symbol=["circle" if p.met else "circle-open" for p in pts], size=8)))
    if f.bound_ms:
        fig.add_hline(y=f.bound_ms, line_dash="dash", line_color="red",
                      annotation_text=f"bound: p{f.percentile:g} {f.bound_ms:g} ms")
    ship = f.metric_qps.get(f.shipped)
    at = [p for p in f.points if p.config == f.shipped and p.met and p.latency_ms is not None]
    if ship and at:
        best = min(at, key=lambda p: abs(p.qps - ship))
        fig.add_trace(go.Scatter(x=[best.qps], y=[best.latency_ms], mode="markers",
                                 name="shipped", marker=dict(symbol="star", size=16,
                                                             color="gold")))
    fig.update_yaxes(type="log", title=f"p{f.percentile_shown:g} latency (ms)")
    fig.update_xaxes(title="QPS completed")
    return fig
