"""The explanation as one self-contained HTML page (``dossier explain --html FILE``).

The page needs no network: plotly.js is embedded once, inline, and every plot is a plotly
figure drawn by it. Plots: the latency distribution of every route (raw samples, one box per
trial, the baseline marked), speedup against accuracy loss (rejected routes too, in another
colour, with the threshold line), the search over time (trial index against speedup, with the
cumulative best) and the knob effects (bars with their intervals). A table lists every trial; a
small inline script sorts it by any column (click the header) and filters its rows (text box).

The markup is the Jinja2 template ``templates/report.html.j2`` (package data), rendered with
autoescape: every fact is escaped there; only plotly.js and plotly's figure markup are passed as
safe. This module chooses what to show (figures, table rows); the template lays it out.

Needs the ``report`` extra (plotly); without it :func:`render_report` raises
:class:`~dossier.errors.BackendUnavailableError` saying what to install.
"""

from __future__ import annotations

import functools
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import jinja2
import numpy as np
from markupsafe import Markup

from dossier.audit.explain import (
    AACheck,
    Explanation,
    TrialFact,
    shown_verdict,
)
from dossier.audit.trade import TradePoint
from dossier.errors import BackendUnavailableError
from dossier.formats import figures as figures_text
from dossier.measure.figure import speedup_text
from dossier.measure.reading import test_name
from dossier.scenarios.curve import figure as scenario_figure

if TYPE_CHECKING:
    import pyarrow as pa


COLOURS = {"baseline": "#1f5fbf", "ok": "#2e9e4f", "rejected": "#e08a00",
           "build_failed": "#c62828", "crashed": "#c62828", "timeout": "#8e24aa",
           "runtime_error": "#c62828", "confirm": "#6d6d6d", "best": "#111111"}
"""Colour of each outcome (and of the baseline) in plots and table."""


def samples_from_timings(table: pa.Table) -> dict[int, list[float]]:
    """Trial index -> its engine's raw samples (the ``candidate`` series), in order."""
    out: dict[int, list[tuple[int, float]]] = {}
    for row in table.select(["trial", "series", "sample", "ms"]).to_pylist():
        if row["series"] == "candidate":
            out.setdefault(row["trial"], []).append((row["sample"], row["ms"]))
    return {k: [ms for _, ms in sorted(v)] for k, v in out.items()}


def _plotly() -> Any:
    try:
        import plotly.graph_objects as go
    except ImportError as exc:
        raise BackendUnavailableError(
            "the HTML report needs plotly, which is not installed here",
            hint="pip install 'dossier[report]'") from exc
    return go


@dataclass(frozen=True)
class _Plot:
    title: str
    caption: str
    body: Markup | None
    """plotly's markup of the figure (trusted: built here from numbers); None: nothing to plot."""


@dataclass(frozen=True)
class _Row:
    """One row of the trial table: each cell as (sort key, text); the route cell's text is
    replaced by what differs from the baseline and the route's tokens."""

    index: int
    classes: str
    cells: list[tuple[str, str]]
    changed: str
    tokens: list[str]


def render_report(e: Explanation, samples: Mapping[int, Sequence[float]]) -> str:
    """The page: the explanation's facts, four plots and the trial table."""
    go = _plotly()
    from plotly.offline import get_plotlyjs

    figures = [
        ("Latency distribution per route", "plot-latency", _latency_figure(go, e, samples),
         "Raw samples of every timed trial (blue: baseline, green: ok, orange: rejected, "
         "grey: confirmation), per inference (a sample is "
         f"{e.search.inferences_per_sample} inference(s), divided by them); the dashed line "
         "is the baseline's median per inference (the confirmation's where it ran), and the "
         "blue dash on each trial the median of the baseline timed alongside it, which that "
         "trial's speedup is measured against. " + _beyond(e, samples)),
        ("Speedup against accuracy loss", "plot-accuracy",
         _trade_figure(go, e) if e.trade else _accuracy_figure(go, e),
         f"Worst {e.search.metric} loss of each validated route against its speedup (bars: "
         f"{e.search.confidence:.0%} interval; the confirmation's reading where it measured "
         "the route, else the screening's); routes at or right of the threshold line are "
         "rejected, and were timed all the same; the line joins the frontier (no other "
         "admissible route is both faster and more accurate); a route that failed the hold-out "
         "set is circled in red." if e.trade else
         f"Worst {e.search.metric} loss of each timed trial against its speedup (bars: "
         f"{e.search.confidence:.0%} interval); routes at or right of the threshold line are "
         "rejected, and were timed all the same."),
        ("The search over time", "plot-search", _search_figure(go, e),
         "Speedup of each trial in the order the search ran them (the confirmation's reading "
         "where it measured the route, hollow: screening only), and the best admissible "
         "speedup so far on the same readings."),
        ("Knob effects", "plot-knobs", _knob_figure(go, e),
         "Speed factor of each knob value against the baseline's value, with its interval: "
         "from one-knob-at-a-time trials (the confirmation's reading where it measured the "
         "route; the others are marked screening) and, when fitted, from the model over all "
         "admissible trials (screening readings). [contention]: a knob whose effect depends "
         "on what else runs on the host."),
    ]
    if e.scenario is not None:  # dossier.scenarios.curve: Model Analyzer's chart
        figures.append((f"Latency against throughput ({e.scenario.scenario})", "plot-scenario",
                        scenario_figure(go, e.scenario), e.scenario.why))
    plots = []
    for title, div_id, fig, caption in figures:
        body = None
        if fig is not None:
            fig.update_layout(template="plotly_white", margin=dict(l=60, r=20, t=30, b=50),
                              height=400, legend=dict(orientation="h", y=-0.22))
            body = Markup(fig.to_html(full_html=False, include_plotlyjs=False, div_id=div_id,
                                      config={"displaylogo": False, "responsive": True}))
        plots.append(_Plot(title, caption, body))
    checks: list[AACheck] = [a for a in (e.aa_check, e.confirm_aa_check) if a is not None]
    return _template().render(
        e=e, title=f"{e.lineage.release} {e.lineage.version}: why this route",
        subtitle=_subtitle(e), plotlyjs=Markup(get_plotlyjs()), plots=plots,
        counts=", ".join(f"{k} {v}" for k, v in e.trial_counts.items()),
        accuracy_trials=[t for t in e.trials if t.role != "confirm" and t.output_losses
                         and t.outcome.value == "ok"],
        aa_checks=checks, columns=_COLUMNS, rows=_rows(e), test_name=test_name,
        shown_verdict=shown_verdict, latency_rows=figures_text.latency_rows(e),
        conditions_rows=figures_text.conditions_rows(e.conditions, e.conditions_of, e.target,
                                                       e.target_note),
        knob_source=figures_text.knob_effect_source,
        effect_verdict=figures_text.effect_verdict, raced_note=figures_text.raced_note,
        trade_lines=[*figures_text.trade_head(e.trade), *(figures_text.point_line(e.trade, p) for p in e.trade.points)]
        if e.trade else [],
        trade_caption=f"{e.trade.metric} loss, worst pair, against the threshold "
                      f"{e.trade.threshold:g}; speed over the baseline; fastest first"
        if e.trade else "")


@functools.cache
def _template() -> jinja2.Template:
    env = jinja2.Environment(loader=jinja2.PackageLoader("dossier.formats", "templates"),
                             autoescape=True, undefined=jinja2.StrictUndefined,
                             trim_blocks=True, lstrip_blocks=True, keep_trailing_newline=True)
    env.filters["fmt"] = format
    env.filters["num"] = _num
    env.globals["speedup"] = speedup_text
    return env.get_template("report.html.j2")


def _subtitle(e: Explanation) -> str:
    lin, s = e.lineage, e.search
    ident = f"dossier {lin.dossier_id}" if lin.dossier_id else "not bundled"
    parent = f"parent {lin.parent}" if lin.parent else "first release"
    return (f"{ident} · {parent} · {lin.backend} ({lin.tuner_version}) · {s.strategy} search "
            f"over {s.selection} · {lin.created_at}")


# ------------------------------------------------------------------------------------ figures
def _label(t: TrialFact) -> str:
    return f"#{t.index}"


def _hover(t: TrialFact) -> str:
    return f"#{t.index} {t.role} {t.outcome.value}<br>{t.route or '(default route)'}"


def _colour(t: TrialFact) -> str:
    if t.role == "baseline":
        return COLOURS["baseline"]
    if t.role == "confirm":
        return COLOURS["confirm"]
    return COLOURS.get(t.outcome.value, "#777777")


def _beyond(e: Explanation, samples: Mapping[int, Sequence[float]]) -> str:
    """What of the latency plot's samples its axis leaves out, for its caption."""
    n = max(e.search.inferences_per_sample, 1)
    series = [[x / n for x in samples[t.index]] for t in e.trials if samples.get(t.index)]
    return beyond_axis(series) if series else ""


def _latency_figure(go: Any, e: Explanation, samples: Mapping[int, Sequence[float]]) -> Any:
    timed = [t for t in e.trials if samples.get(t.index)]
    if not timed:
        return None
    n = max(e.search.inferences_per_sample, 1)  # a sample's inferences
    per = {t.index: [x / n for x in samples[t.index]] for t in timed}
    fig = go.Figure()
    for t in timed:
        fig.add_trace(go.Box(y=per[t.index], name=_label(t), marker_color=_colour(t),
                             boxpoints="outliers", hovertext=_hover(t), showlegend=False,
                             hoverinfo="y+text"))
    bl = e.baseline_latency
    if bl is not None:  # named in the legend: an annotation on the plot overlapped the boxes
        fig.add_hline(y=bl.median_ms, line_dash="dash", line_color=COLOURS["baseline"])
        fig.add_trace(go.Scatter(
            x=[None], y=[None], mode="lines", showlegend=True, hoverinfo="skip",
            line=dict(dash="dash", color=COLOURS["baseline"]),
            name=f"baseline {bl.median_ms:.4g} ms per inference ({bl.source}, record "
                 f"{bl.trial_index})"))
    paired = [t for t in timed if t.baseline_median_ms is not None]
    if paired:  # each trial is judged against the baseline timed alongside it, not the line
        fig.add_trace(go.Scatter(
            x=[_label(t) for t in paired], y=[(t.baseline_median_ms or 0.0) / n for t in paired],
            mode="markers", name="median of the baseline timed alongside",
            marker=dict(symbol="line-ew-open", size=28, color=COLOURS["baseline"],
                        line=dict(width=2)),
            hovertext=[f"#{t.index}: baseline alongside {(t.baseline_median_ms or 0.0) / n:.4g} "
                       f"ms per inference, {_num(t.speedup, '.3f')}x, {t.verdict}"
                       for t in paired],
            hoverinfo="text", showlegend=True))
    fig.update_yaxes(**latency_axis([per[t.index] for t in timed]))
    fig.update_xaxes(title_text="trial")  # the colours are said in the caption: a longer
    # title was clipped in a narrow window
    return fig


LOG_AXIS_SPREAD = 4.0
"""Latencies spread wider than this factor (slowest trial's 99th percentile over the fastest
trial's 1st) get a log axis; closer ones a linear axis fitted to them."""


def _latency_bounds(series: Sequence[Sequence[float]]) -> tuple[bool, float, float]:
    """Whether the latency axis is logarithmic, and its bottom and top (see
    :func:`latency_axis`)."""
    lo = min(float(np.percentile(x, 1)) for x in series)
    hi = max(float(np.percentile(x, 99)) for x in series)
    log = lo > 0 and hi / lo > LOG_AXIS_SPREAD
    if log:
        return True, lo / 1.15, hi * 1.15
    pad = max(0.08 * (hi - lo), 0.02 * hi, 1e-6)
    return False, max(0.0, lo - pad), hi + pad


def latency_axis(series: Sequence[Sequence[float]]) -> dict[str, Any]:
    """The latency plot's y axis, fitted to the samples (1st to 99th percentile of every trial,
    so a few stragglers do not squash the boxes, as a zero-based axis did: boxes of 0.2-0.5 ms
    flat on an axis to 50 ms); log when the trials differ by more than LOG_AXIS_SPREAD. Its
    title is short enough to be drawn whole at the figure's height (a longer one was clipped):
    what lies beyond the axis is said in the caption (:func:`beyond_axis`)."""
    log, bottom, top = _latency_bounds(series)
    if log:
        return dict(type="log", range=[float(np.log10(bottom)), float(np.log10(top))],
                    title_text="ms per inference (log)", automargin=True)
    return dict(type="linear", range=[bottom, top], title_text="ms per inference",
                automargin=True)


def beyond_axis(series: Sequence[Sequence[float]]) -> str:
    """``N sample(s) beyond the axis: zoom out`` for samples outside :func:`latency_axis`'s
    range ("" when none)."""
    _, bottom, top = _latency_bounds(series)
    outside = sum(1 for x in series for v in x if v < bottom or v > top)
    return f"{outside} sample(s) beyond the axis: zoom out." if outside else ""


def _err(t: TrialFact) -> tuple[float, float]:
    s = t.speedup or 0.0
    return (max((t.speedup_ci_high or s) - s, 0.0), max(s - (t.speedup_ci_low or s), 0.0))


def _accuracy_figure(go: Any, e: Explanation) -> Any:
    timed = [t for t in e.trials if t.speedup is not None and t.role != "confirm"]
    if not timed:
        return None
    thr = e.search.threshold
    finite = [t.worst_loss for t in timed if t.worst_loss is not None and t.worst_loss > 0]
    floor = min([*finite, thr]) / 100
    nan_x = max([*finite, thr]) * 100
    fig = go.Figure()
    ok = [t for t in timed if t.outcome.value == "ok"]
    bad = [t for t in timed if t.outcome.value != "ok"]
    groups = [("admissible", ok, COLOURS["ok"], "circle"),
              ("rejected", [t for t in bad if t.worst_loss is not None], COLOURS["rejected"],
               "diamond"),
              ("rejected (NaN/Inf output)", [t for t in bad if t.worst_loss is None],
               COLOURS["build_failed"], "x")]
    for name, pts, colour, symbol in groups:
        if not pts:
            continue
        xs = [nan_x if t.worst_loss is None else max(t.worst_loss, floor) for t in pts]
        errs = [_err(t) for t in pts]
        fig.add_trace(go.Scatter(
            x=xs, y=[t.speedup for t in pts], mode="markers", name=name,
            marker=dict(color=colour, symbol=symbol, size=10),
            error_y=dict(type="data", symmetric=False, array=[a for a, _ in errs],
                         arrayminus=[b for _, b in errs], thickness=1),
            hovertext=[_hover(t) + f"<br>worst loss {_num(t.worst_loss)}" for t in pts],
            hoverinfo="text+y"))
    _loss_axes(fig, thr, e.search.metric, floor, nan_x)
    return fig


def _trade_figure(go: Any, e: Explanation) -> Any:
    """Speed against worst loss of every validated route (:class:`~dossier.audit.trade.Trade`):
    the frontier joined, rejected routes apart, hold-out failures circled."""
    t = e.trade
    pts = [p for p in t.points if p.speedup is not None] if t else []
    if t is None or not pts:
        return None
    thr = t.threshold
    finite = [p.worst_loss for p in pts if p.worst_loss is not None and p.worst_loss > 0]
    floor = min([*finite, thr]) / 100
    nan_x = max([*finite, thr]) * 100

    def x(p: Any) -> float:
        return nan_x if p.worst_loss is None else max(p.worst_loss, floor)

    fig = go.Figure()
    for name, group, colour, symbol in (
            ("admissible", [p for p in pts if p.outcome == "ok"], COLOURS["ok"], "circle"),
            ("rejected for accuracy", [p for p in pts if p.outcome != "ok"],
             COLOURS["rejected"], "diamond")):
        if not group:
            continue
        fig.add_trace(go.Scatter(
            x=[x(p) for p in group], y=[p.speedup for p in group], mode="markers", name=name,
            marker=dict(color=colour, symbol=symbol, size=11),
            error_y=dict(type="data", symmetric=False, array=[_bars(p)[0] for p in group],
                         arrayminus=[_bars(p)[1] for p in group], thickness=1),
            hovertext=[f"{p.route or '(default route)'}<br>{figures_text.reading_text(p)}<br>worst loss "
                       f"{_num(p.worst_loss)}" for p in group], hoverinfo="text+y"))
    front = sorted((p for p in pts if p.frontier), key=x)
    if len(front) > 1:
        fig.add_trace(go.Scatter(x=[x(p) for p in front], y=[p.speedup for p in front],
                                 mode="lines", name="frontier",
                                 line=dict(color=COLOURS["ok"], dash="dot")))
    failed = [p for p in pts if p.holdout_passed is False]
    if failed:
        fig.add_trace(go.Scatter(x=[x(p) for p in failed], y=[p.speedup for p in failed],
                                 mode="markers", name="failed the hold-out set",
                                 marker=dict(color="rgba(0,0,0,0)", size=22,
                                             line=dict(color=COLOURS["build_failed"], width=2))))
    _loss_axes(fig, thr, t.metric, floor, nan_x)
    return fig


def _loss_axes(fig: Any, thr: float, metric: str, floor: float, nan_x: float) -> None:
    """The axes of a speed-against-loss plot: the threshold line, 1.0x, the log loss axis
    (where 0 and NaN/Inf are drawn)."""
    fig.add_vline(x=thr, line_dash="dash", line_color=COLOURS["build_failed"],
                  annotation_text=f"threshold {thr:g}", annotation_position="top")
    fig.add_hline(y=1.0, line_dash="dot", line_color="#888888")
    fig.update_xaxes(type="log", title_text=f"worst {metric} loss (log; 0 drawn at "
                     f"{floor:.1e}, NaN/Inf at {nan_x:.1e})")
    fig.update_yaxes(title_text="speedup over the baseline (x)")


def _bars(p: TradePoint) -> tuple[float, float]:
    """A trade point's error bars above and below its speedup."""
    v = p.speedup or 0.0
    hi = p.speedup_ci_high if p.speedup_ci_high is not None else v
    lo = p.speedup_ci_low if p.speedup_ci_low is not None else v
    return hi - v, v - lo


def _search_figure(go: Any, e: Explanation) -> Any:
    timed = [t for t in e.trials if t.speedup is not None and t.role != "confirm"]
    if not timed:
        return None
    fig = go.Figure()
    groups = [("baseline (A/A check)", [t for t in timed if t.role == "baseline"])]
    groups += [(outcome, [t for t in timed if t.role != "baseline" and t.outcome.value == outcome])
               for outcome in sorted({t.outcome.value for t in timed})]
    for name, pts in groups:
        if not pts:
            continue
        errs = [shown_error(t) for t in pts]
        fig.add_trace(go.Scatter(
            x=[t.index for t in pts], y=[shown_speedup(t) for t in pts], mode="markers",
            name=name, marker=dict(
                color=_colour(pts[0]), size=9,
                symbol=["circle" if t.confirmed_speedup is not None or t.role == "baseline"
                        else "circle-open" for t in pts]),
            error_y=dict(type="data", symmetric=False, array=[a for a, _ in errs],
                         arrayminus=[b for _, b in errs], thickness=1),
            hovertext=[_hover(t) + ("<br>confirmation (record "
                                    f"{t.confirmed_in}); screening read {_num(t.speedup, '.3f')}x"
                                    if t.confirmed_speedup is not None else "<br>screening only")
                       for t in pts], hoverinfo="text+y"))
    best, xs, ys = 1.0, [], []
    for t in sorted(timed, key=lambda t: t.index):
        if t.role == "search" and t.outcome.value == "ok" and t.speedup is not None:
            best = max(best, shown_speedup(t))
        xs.append(t.index)
        ys.append(best)
    fig.add_trace(go.Scatter(x=xs, y=ys, mode="lines", name="best admissible so far",
                             line=dict(color=COLOURS["best"], shape="hv", width=2)))
    shipped = next((t for t in e.trials if t.shipped), None)
    if shipped is not None and shipped.speedup is not None and shipped.role != "baseline":
        fig.add_trace(go.Scatter(x=[shipped.index], y=[shown_speedup(shipped)], mode="markers",
                                 name="shipped", marker=dict(symbol="star", size=16,
                                                             color="#ffd600",
                                                             line=dict(color="#333", width=1))))
    fig.add_hline(y=1.0, line_dash="dot", line_color="#888888")
    fig.update_xaxes(title_text="trial index (search order)")
    fig.update_yaxes(title_text="speedup over the baseline (x)")
    return fig


def shown_speedup(t: TrialFact) -> float:
    """The speedup a chart shows for a trial: the confirmation's where it measured the
    route, else the screening one."""
    if t.confirmed_speedup is not None:
        return t.confirmed_speedup
    return t.speedup or 0.0


def shown_error(t: TrialFact) -> tuple[float, float]:
    """The error bar of :func:`shown_speedup` (above, below)."""
    if t.confirmed_speedup is None:
        return _err(t)
    s = t.confirmed_speedup
    return (max((t.confirmed_ci_high or s) - s, 0.0), max(s - (t.confirmed_ci_low or s), 0.0))


def _knob_figure(go: Any, e: Explanation) -> Any:
    one = e.knob_effects
    model = e.knob_model.effects if e.knob_model.fitted else []
    if not one and not model:
        return None
    fig = go.Figure()
    for name, items, colour in (
            ("one knob at a time (the confirmation where it measured the route)",
             [(f"{x.knob}={x.value}" + (" [contention]" if x.contention_sensitive else "")
               + ("" if x.source == "confirmation" else " (screening)"),
               x.speedup, x.speedup_ci_low, x.speedup_ci_high) for x in one], "#1f77b4"),
            ("model over all admissible trials",
             [(f"{x.knob}={x.value}", x.speed_factor, x.ci_low, x.ci_high) for x in model],
             "#ff7f0e")):
        if not items:
            continue
        fig.add_trace(go.Bar(
            y=[i[0] for i in items], x=[i[1] - 1.0 for i in items], base=1.0, orientation="h",
            name=name, marker_color=colour,
            error_x=dict(type="data", symmetric=False,
                         array=[max(i[3] - i[1], 0.0) for i in items],
                         arrayminus=[max(i[1] - i[2], 0.0) for i in items]),
            hovertext=[f"{i[0]}: {speedup_text(i[1], i[2], i[3])}" for i in items],
            hoverinfo="text"))
    fig.add_vline(x=1.0, line_color="#444444")
    fig.update_layout(barmode="group")
    fig.update_xaxes(title_text="speed factor against the baseline's value (> 1: faster)")
    return fig


# --------------------------------------------------------------------------------------- text
def _num(x: float | None, spec: str = ".3g") -> str:
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return "-" if x is None else str(x)
    return format(x, spec)


_COLUMNS = ("#", "role", "outcome", "route (what differs from the baseline, then all of it)",
            "median ms a sample", "95% CI ms a sample", "baseline alongside ms a sample",
            "ms per inference", "p99 ms per inference", "speedup", "speedup CI", "p",
            "verdict", "worst loss", "build s", "reason")


def _rows(e: Explanation) -> list[_Row]:
    base = next((t.knobs for t in e.trials if t.role == "baseline"), {})
    rows = []
    for t in e.trials:
        cells: list[tuple[object, str]] = [
            (t.index, str(t.index)), (t.role, t.role), (t.outcome.value, t.outcome.value),
            (t.route, t.route or "(default route)"),
            (t.median_ms, _num(t.median_ms, ".4f")),
            (t.ci_low_ms, "-" if t.ci_low_ms is None else
             f"[{t.ci_low_ms:.4f}, {t.ci_high_ms:.4f}]"),
            (t.baseline_median_ms, _num(t.baseline_median_ms, ".4f")),
            (t.latency.median_ms if t.latency else None,
             _num(t.latency.median_ms if t.latency else None, ".4g")),
            (t.latency.p99_ms if t.latency else None,
             _num(t.latency.p99_ms if t.latency else None, ".4g")),
            (t.speedup, _num(t.speedup, ".3f")),
            (t.speedup_ci_low, "-" if t.speedup_ci_low is None else
             f"[{t.speedup_ci_low:.3f}, {t.speedup_ci_high:.3f}]"),
            (t.p_value, _num(t.p_value)),
            (t.verdict or "", (shown_verdict(t.verdict, t.role) or "-")
             + (f"; {t.raced}" if t.raced else "")),
            (t.worst_loss, _num(t.worst_loss)),
            (t.build_s, _num(t.build_s, ".3f")), (t.reason or "", t.reason or ""),
        ]
        classes = f"o-{t.outcome.value}" + (" shipped" if t.shipped else "") + \
            (" baseline" if t.role == "baseline" else "")
        rows.append(_Row(
            index=t.index, classes=classes, cells=[(_sort_key(k), v) for k, v in cells],
            changed=" ".join(f"-{k}={v}" for k, v in sorted(t.knobs.items())
                             if base.get(k) != v),
            tokens=t.route.split()))
    return rows


def _sort_key(value: object) -> str:
    if value is None:
        return ""
    if isinstance(value, float) and not math.isfinite(value):
        return json.dumps(str(value))
    return str(value)
