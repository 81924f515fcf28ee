"""The explanation as one self-contained HTML page (``dossier explain --html FILE``).

The page needs no network: plotly.js is embedded once, inline, and every plot is a plotly
figure drawn by it. Plots: the latency distribution of every route (raw samples, one box per
trial, the baseline marked), speedup against accuracy loss (rejected routes too, in another
colour, with the threshold line), the search over time (trial index against speedup, with the
cumulative best) and the knob effects (bars with their intervals). A table lists every trial; a
small inline script sorts it by any column (click the header) and filters its rows (text box).

Needs the ``report`` extra (plotly); without it :func:`render_report` raises
:class:`~dossier.errors.BackendUnavailableError` saying what to install.
"""

from __future__ import annotations

import html
import json
import math
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from dossier.audit.explain import Explanation, TrialFact, explain, test_name
from dossier.errors import BackendUnavailableError

if TYPE_CHECKING:
    import pyarrow as pa

    from dossier.bundle import Bundle

COLOURS = {"baseline": "#1f5fbf", "ok": "#2e9e4f", "rejected": "#e08a00",
           "build_failed": "#c62828", "crashed": "#c62828", "timeout": "#8e24aa",
           "runtime_error": "#c62828", "confirm": "#6d6d6d", "best": "#111111"}
"""Colour of each outcome (and of the baseline) in plots and table."""


def report_html(bundle: Bundle, *, inferences_per_day: float | None = None,
                horizon_days: float | None = None, hosts: int | None = None) -> str:
    """The report page of an opened bundle (raw samples from its timings.parquet)."""
    facts = explain(bundle, inferences_per_day=inferences_per_day, horizon_days=horizon_days,
                    hosts=hosts)
    return render_report(facts, samples_from_timings(bundle.timings()))


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


def render_report(e: Explanation, samples: Mapping[int, Sequence[float]]) -> str:
    """The page: the explanation's facts, four plots and the trial table."""
    go = _plotly()
    from plotly.offline import get_plotlyjs

    figures = [
        ("Latency distribution per route", "plot-latency", _latency_figure(go, e, samples),
         "Raw samples of every timed trial (one sample = one pass over the validation "
         "inputs); the dashed line is the baseline's median in its own trial, and the blue "
         "dash on each trial the median of the baseline timed alongside it, which that "
         "trial's speedup is measured against."),
        ("Speedup against accuracy loss", "plot-accuracy", _accuracy_figure(go, e),
         f"Worst {e.search.metric} loss of each timed trial against its speedup (bars: "
         f"{e.search.confidence:.0%} interval); routes at or right of the threshold line are "
         "rejected, and were timed all the same."),
        ("The search over time", "plot-search", _search_figure(go, e),
         "Screening speedup of each trial in the order the search ran them, and the best "
         "admissible speedup so far."),
        ("Knob effects", "plot-knobs", _knob_figure(go, e),
         "Speed factor of each knob value against the baseline's value, with its interval: "
         "from one-knob-at-a-time trials and, when fitted, from the model over all "
         "admissible trials."),
    ]
    plots = []
    for title, div_id, fig, caption in figures:
        if fig is None:
            body = "<p class='note'>Nothing to plot: no trial has the data this plot needs.</p>"
        else:
            fig.update_layout(template="plotly_white", margin=dict(l=60, r=20, t=30, b=50),
                              height=400, legend=dict(orientation="h", y=-0.22))
            body = fig.to_html(full_html=False, include_plotlyjs=False, div_id=div_id,
                               config={"displaylogo": False, "responsive": True})
        plots.append(f"<section class='plot'><h2>{_e(title)}</h2><p class='caption'>"
                     f"{_e(caption)}</p>{body}</section>")
    title = f"{e.lineage.release} {e.lineage.version}: why this route"
    return _PAGE.format(
        title=_e(title), subtitle=_e(_subtitle(e)), style=_STYLE, plotlyjs=get_plotlyjs(),
        script=_SCRIPT, summary=_summary_html(e), plots="\n".join(plots),
        details=_details_html(e), table=_table_html(e))


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


def _latency_figure(go: Any, e: Explanation, samples: Mapping[int, Sequence[float]]) -> Any:
    timed = [t for t in e.trials if samples.get(t.index)]
    if not timed:
        return None
    fig = go.Figure()
    for t in timed:
        fig.add_trace(go.Box(y=list(samples[t.index]), name=_label(t), marker_color=_colour(t),
                             boxpoints="outliers", hovertext=_hover(t), showlegend=False,
                             hoverinfo="y+text"))
    base = next((t for t in e.trials if t.role == "baseline"), None)
    if base is not None and base.median_ms is not None:
        fig.add_hline(y=base.median_ms, line_dash="dash", line_color=COLOURS["baseline"],
                      annotation_text=f"baseline (trial {base.index}) {base.median_ms:.3f} ms",
                      annotation_position="top left")
    paired = [t for t in timed if t.baseline_median_ms is not None]
    if paired:  # each trial is judged against the baseline timed alongside it, not the line
        fig.add_trace(go.Scatter(
            x=[_label(t) for t in paired], y=[t.baseline_median_ms for t in paired],
            mode="markers", name="median of the baseline timed alongside",
            marker=dict(symbol="line-ew-open", size=28, color=COLOURS["baseline"],
                        line=dict(width=2)),
            hovertext=[f"#{t.index}: baseline alongside {t.baseline_median_ms:.3f} ms, "
                       f"{_num(t.speedup, '.3f')}x, {t.verdict}" for t in paired],
            hoverinfo="text", showlegend=True))
    fig.update_yaxes(title_text="latency per sample (ms)", rangemode="tozero")
    p95 = max(float(np.percentile(samples[t.index], 95)) for t in timed)
    top = max(max(samples[t.index]) for t in timed)
    if top > 3 * p95:  # a few stragglers would squash every box: clip, and say so
        fig.update_yaxes(range=[0, 1.5 * p95],
                         title_text="latency per sample (ms; clipped, zoom out for outliers)")
    fig.update_xaxes(title_text="trial (blue: baseline, green: ok, orange: rejected, grey: "
                     "confirmation)")
    return fig


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
    fig.add_vline(x=thr, line_dash="dash", line_color=COLOURS["build_failed"],
                  annotation_text=f"threshold {thr:g}", annotation_position="top")
    fig.add_hline(y=1.0, line_dash="dot", line_color="#888888")
    fig.update_xaxes(type="log", title_text=f"worst {e.search.metric} loss (log; 0 drawn at "
                     f"{floor:.1e}, NaN/Inf at {nan_x:.1e})")
    fig.update_yaxes(title_text="speedup over the baseline (x)")
    return fig


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
        errs = [_err(t) for t in pts]
        fig.add_trace(go.Scatter(
            x=[t.index for t in pts], y=[t.speedup for t in pts], mode="markers", name=name,
            marker=dict(color=_colour(pts[0]), size=9),
            error_y=dict(type="data", symmetric=False, array=[a for a, _ in errs],
                         arrayminus=[b for _, b in errs], thickness=1),
            hovertext=[_hover(t) for t in pts], hoverinfo="text+y"))
    best, xs, ys = 1.0, [], []
    for t in sorted(timed, key=lambda t: t.index):
        if t.role == "search" and t.outcome.value == "ok" and t.speedup is not None:
            best = max(best, t.speedup)
        xs.append(t.index)
        ys.append(best)
    fig.add_trace(go.Scatter(x=xs, y=ys, mode="lines", name="best admissible so far",
                             line=dict(color=COLOURS["best"], shape="hv", width=2)))
    shipped = next((t for t in e.trials if t.shipped), None)
    if shipped is not None and shipped.speedup is not None and shipped.role != "baseline":
        fig.add_trace(go.Scatter(x=[shipped.index], y=[shipped.speedup], mode="markers",
                                 name="shipped", marker=dict(symbol="star", size=16,
                                                             color="#ffd600",
                                                             line=dict(color="#333", width=1))))
    fig.add_hline(y=1.0, line_dash="dot", line_color="#888888")
    fig.update_xaxes(title_text="trial index (search order)")
    fig.update_yaxes(title_text="speedup over the baseline (x)")
    return fig


def _knob_figure(go: Any, e: Explanation) -> Any:
    one = e.knob_effects
    model = e.knob_model.effects if e.knob_model.fitted else []
    if not one and not model:
        return None
    fig = go.Figure()
    for name, items, colour in (
            ("one knob at a time (interleaved with the baseline)",
             [(f"{x.knob}={x.value}", x.speedup, x.speedup_ci_low, x.speedup_ci_high)
              for x in one], "#1f77b4"),
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
            hovertext=[f"{i[0]}: {i[1]:.3f}x [{i[2]:.3f}, {i[3]:.3f}]" for i in items],
            hoverinfo="text"))
    fig.add_vline(x=1.0, line_color="#444444")
    fig.update_layout(barmode="group")
    fig.update_xaxes(title_text="speed factor against the baseline's value (> 1: faster)")
    return fig


# --------------------------------------------------------------------------------------- text
def _e(text: object) -> str:
    return html.escape(str(text), quote=True)


def _num(x: float | None, spec: str = ".3g") -> str:
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return "-" if x is None else str(x)
    return format(x, spec)


def _dl(rows: Sequence[tuple[str, str]]) -> str:
    return "<dl>" + "".join(f"<dt>{_e(k)}</dt><dd>{v}</dd>" for k, v in rows) + "</dl>"


def _route(route: str) -> str:
    return f"<code>{_e(route or '(default route)')}</code>"


def _summary_html(e: Explanation) -> str:
    d = e.decision
    parts = []
    verdict_cls = "gain" if d.gain else "nogain"
    head = (f"ships {_route(d.shipped_route)}: {_e(d.result)}" if d.gain
            else f"no significant gain: the baseline {_route(d.shipped_route)} ships")
    parts.append(f"<p class='verdict {verdict_cls}'>{head}</p><p>{_e(d.reason)}</p>")
    if d.why_not:
        h = e.head_to_head
        lead = ("" if h is None else f"<p>The best candidate, {_route(h.route)} (trial "
                f"{h.trial_index}), did not win:</p>")
        parts.append(lead + "<ul class='why'>" + "".join(f"<li>{_e(w)}</li>" for w in d.why_not)
                     + "</ul>")
    h = e.head_to_head
    if h is not None:
        title = "Winner against the baseline" if h.shipped else \
            "Best candidate against the baseline"
        src = ("confirmation round (re-timed with the baseline in a fresh process)"
               if h.source == "confirmation" else "screening (its search trial)")
        rows = [
            ("candidate", f"{_route(h.route)} (trial {h.trial_index})"),
            ("measured in", _e(f"{src}, record {h.measured_in}")),
            ("candidate median", _e(f"{h.candidate.median_ms:.4f} ms [{h.candidate.ci_low_ms:.4f}, "
                                    f"{h.candidate.ci_high_ms:.4f}] (n={h.candidate.n})")),
            ("baseline median", _e(f"{h.baseline.median_ms:.4f} ms [{h.baseline.ci_low_ms:.4f}, "
                                   f"{h.baseline.ci_high_ms:.4f}] (n={h.baseline.n}), timed "
                                   f"alongside it in record {h.measured_in}")),
            ("speedup", _e(f"{h.speedup:.3f}x [{h.speedup_ci_low:.3f}, {h.speedup_ci_high:.3f}] "
                           f"({h.confidence:.0%} interval)")),
            ("test", _e(f"{test_name(h.test)}: p={h.p_value:.3g} against alpha="
                        f"{h.alpha:.3g} ({'significant' if h.significant else 'not significant'})")),
            ("minimum effect", _e(f"{h.min_effect:.0%}: "
                                  + (f"a slowdown ({h.speedup:.3f}x), not a gain" if h.speedup < 1
                                     else "reached" if h.reaches_min_effect else "not reached"))),
        ] + ([("verdict", _e(h.verdict))] if h.verdict else [])
        parts.append(f"<h2>{title}</h2>" + _dl(rows))
    if e.runner_up is not None:
        r = e.runner_up
        same = h is not None and h.route == r.route
        parts.append("<h2>Runner-up</h2>" + _dl([
            ("route", ("the best candidate above" if same else _route(r.route))
             + f" (trial {r.trial_index})"),
            ("speedup", _e(f"{r.speedup:.3f}x [{r.speedup_ci_low:.3f}, {r.speedup_ci_high:.3f}] "
                           f"({r.source})")),
            ("margin", _e(f"the shipped route is {r.margin:+.1%} against it "
                          f"({r.winner_speedup:.3f}x vs {r.speedup:.3f}x)"))]))
    parts.append(_accuracy_html(e))
    counts = ", ".join(f"{k} {v}" for k, v in e.trial_counts.items())
    parts.append(f"<p class='glance'><b>Trials</b> {_e(counts)} (+{e.confirm_trials} "
                 f"confirmation) &middot; <b>Search</b> {e.cost.search_wall_s:.1f} s &middot; "
                 f"<b>Payback</b> {_e(e.payback.verdict.split(';')[0])}</p>")
    return "<div class='summary'>" + "\n".join(parts) + "</div>"


def _accuracy_html(e: Explanation) -> str:
    shown = [t for t in e.trials if t.role != "confirm" and t.output_losses
             and t.outcome.value == "ok"]
    if not shown:
        return ""
    rows = "".join(
        f"<tr><td>#{t.index}{' (shipped)' if t.shipped else ''}</td><td>{_route(t.route)}</td>"
        f"<td>{_e(x.output)}</td><td>{'NaN/Inf' if x.loss is None else _e(f'{x.loss:.3g}')}"
        f"</td><td>{_e(x.pair)}</td></tr>" for t in shown for x in t.output_losses)
    return (f"<h2>Accuracy of the passing routes</h2><p class='caption'>{_e(e.search.metric)} "
            f"loss per output, the worst pair of {e.search.validation_pairs}; admissible below "
            f"{_e(f'{e.search.threshold:g}')}.</p><table class='facts'><tr><th>trial</th>"
            "<th>route</th><th>output</th><th>worst loss</th><th>pair</th></tr>"
            f"{rows}</table>")


def _details_html(e: Explanation) -> str:
    d, s, lin = e.decision, e.search, e.lineage
    parts = [f"<h2>Decision rule</h2><p>{_e(d.rule)}</p>"]
    counts = ", ".join(f"{k} {v}" for k, v in e.trial_counts.items())
    parts.append(f"<h2>Trials</h2><p>{_e(counts)} (+{e.confirm_trials} confirmation "
                 f"re-measurements); strategy {_e(s.strategy)} over <code>{_e(s.selection)}"
                 f"</code>; accuracy: {_e(s.metric)} &lt; {_e(f'{s.threshold:g}')} on every "
                 f"output of {s.validation_pairs} pair(s)</p>")
    if e.rejected:
        items = []
        for r in e.rejected:
            detail = "; ".join(
                f"{f.pair} / {f.output}: " + ("NaN/Inf" if f.loss is None else
                                              f"{f.loss:.3g} >= {f.threshold:g}")
                for f in r.failures) or (r.error or r.reason)
            items.append(f"<li>#{r.index} <span class='o-{_e(r.outcome.value)}'>"
                         f"{_e(r.outcome.value)}</span> {_route(r.route)}: {_e(detail)}</li>")
        parts.append("<h2>Rejected trials</h2><ul>" + "".join(items) + "</ul>")
    if e.knob_effects:
        rows_html = "".join(
            f"<tr><td>{_e(k.knob)}</td><td>{_e(k.baseline_value)} &rarr; {_e(k.value)}</td>"
            f"<td>{k.speedup:.3f}x [{k.speedup_ci_low:.3f}, {k.speedup_ci_high:.3f}]</td>"
            f"<td>{k.p_value:.3g}</td><td>{_e(k.verdict)}</td><td>#{k.trial_index} "
            f"{_e(k.outcome.value)}</td></tr>" for k in e.knob_effects)
        parts.append("<h2>Knob effects, one knob at a time</h2><table class='facts'><tr>"
                     "<th>knob</th><th>change</th><th>speedup [CI]</th><th>p</th><th>effect</th>"
                     f"<th>trial</th></tr>{rows_html}</table>")
    m = e.knob_model
    if m.fitted:
        rows_html = "".join(
            f"<tr><td>{_e(x.knob)}</td><td>{_e(x.reference)} &rarr; {_e(x.value)}</td>"
            f"<td>{x.speed_factor:.3f}x [{x.ci_low:.3f}, {x.ci_high:.3f}]</td>"
            f"<td>{x.std_error:.3f}</td><td>{x.trials}</td></tr>" for x in m.effects)
        parts.append("<h2>Knob effects, model over all admissible trials</h2>"
                     f"<p class='caption'>{_e(m.method)}. {_e(m.note)}; R&sup2; "
                     f"{_num(m.r_squared)}.</p><table class='facts'><tr><th>knob</th>"
                     "<th>change</th><th>speed factor [CI]</th><th>SE (log)</th>"
                     f"<th>trials</th></tr>{rows_html}</table>")
    else:
        parts.append(f"<h2>Knob model</h2><p class='caption'>Not fitted: {_e(m.note)}.</p>")
    checks = [a for a in (e.aa_check, e.confirm_aa_check) if a is not None]
    if checks:
        parts.append("<h2>A/A check of the baseline</h2>" + "".join(
            f"<p>{_e(a.procedure)}: {a.speedup:.3f}x [{a.speedup_ci_low:.3f}, "
            f"{a.speedup_ci_high:.3f}], p={a.p_value:.3g}"
            + (f", {a.rounds} rounds" if a.rounds else "") + f": {_e(a.verdict)}</p>"
            for a in checks))
    parts.append("<h2>Environment (tuning host)</h2>" + _environment_html(e))
    parts.append("<h2>Lineage</h2>" + _dl([
        ("release", _e(f"{lin.release} version {lin.version}")),
        ("dossier id", _e(lin.dossier_id or "(not bundled)")),
        ("parent", _e(lin.parent or "none: first release")),
        ("created", _e(f"{lin.created_at} by dossier {lin.tool_version}")),
        ("backend", _e(f"{lin.backend} ({lin.tuner_version})"))]))
    c = e.cost
    parts.append("<h2>Search cost</h2>" + _dl([
        ("search wall time", _e(f"{c.search_wall_s:.1f} s over {c.sessions} session(s)")),
        ("builds", _e(f"{c.build_s:.1f} s")),
        ("measurement", _e(f"{c.measure_s:.1f} s (confirmation round {c.confirm_s:.1f} s)"))]))
    p = e.payback
    cases = "".join(
        f"<tr><td>{_e(x.case)}</td><td>{x.speedup:.3f}x</td><td>{x.saved_ms:.4f}</td>"
        f"<td>{_e('never' if x.inferences is None else f'{x.inferences:,.0f}')}</td>"
        f"<td>{_e('-' if x.days is None else f'{x.days:,.1f}')}</td>"
        f"<td>{'yes' if x.within_horizon else 'no'}</td></tr>" for x in p.cases)
    volume = (f"{p.inferences_per_day:,.0f} inferences/day on {p.hosts} host(s), horizon "
              f"{p.horizon_days:g} days (from {p.source})" if p.source != "none"
              else "no expected volume given")
    parts.append(f"<h2>Payback</h2><p>{_e(p.verdict)}.</p><p class='caption'>{_e(volume)}; "
                 f"{_e(p.unit)}.</p>" + (
                     "<table class='facts'><tr><th>case</th><th>speedup</th><th>saved ms per "
                     "inference</th><th>inferences to pay back</th><th>days</th><th>within "
                     f"horizon</th></tr>{cases}</table>" if p.cases else ""))
    return "\n".join(parts)


def _environment_html(e: Explanation) -> str:
    env = e.environment
    if env is None:
        return "<p>unknown (no fingerprint)</p>"
    gpus = "; ".join(f"{g.name} (cc {g.compute_capability}, {g.memory_total_mib} MiB, driver "
                     f"{g.driver_version})" for g in env.gpus) or "none"
    return _dl([
        ("host", _e(env.hostname or "?")),
        ("CPU", _e(f"{env.cpu} ({env.cpu_vendor}), {env.cores} logical / "
                   f"{env.physical_cores} physical cores")),
        ("ISA", _e(" ".join(env.isa_flags) or "-")),
        ("OS", _e(f"{env.os}, kernel {env.kernel}, {env.machine}, glibc {env.glibc}")),
        ("Python", _e(env.python)),
        ("packages", _e(", ".join(f"{k} {v}" for k, v in env.packages.items()))),
        ("GPU", _e(gpus + (f"; CUDA runtime {env.cuda_runtime}" if env.cuda_runtime else ""))),
        ("collected", _e(env.collected_at))])


_COLUMNS = ("#", "role", "outcome", "route (what differs from the baseline, then all of it)",
            "median ms", "95% CI ms", "baseline alongside ms", "speedup", "speedup CI", "p",
            "verdict", "worst loss", "build s", "reason")


def _table_html(e: Explanation) -> str:
    head = "".join(f"<th data-col='{i}' title='click to sort'>{_e(c)}</th>"
                   for i, c in enumerate(_COLUMNS))
    rows = []
    base = next((t.knobs for t in e.trials if t.role == "baseline"), {})
    for t in e.trials:
        changed = " ".join(f"-{k}={v}" for k, v in sorted(t.knobs.items()) if base.get(k) != v)
        route_html = (f"<b>{_e(changed or '(the baseline route)')}</b><br><span class='route'>"
                      + " ".join(f"<span>{_e(tok)}</span>" for tok in t.route.split())
                      + "</span>")
        cells = [
            (t.index, str(t.index)), (t.role, t.role), (t.outcome.value, t.outcome.value),
            (t.route, t.route or "(default route)"),
            (t.median_ms, _num(t.median_ms, ".4f")),
            (t.ci_low_ms, "-" if t.ci_low_ms is None else
             f"[{t.ci_low_ms:.4f}, {t.ci_high_ms:.4f}]"),
            (t.baseline_median_ms, _num(t.baseline_median_ms, ".4f")),
            (t.speedup, _num(t.speedup, ".3f")),
            (t.speedup_ci_low, "-" if t.speedup_ci_low is None else
             f"[{t.speedup_ci_low:.3f}, {t.speedup_ci_high:.3f}]"),
            (t.p_value, _num(t.p_value)), (t.verdict or "", t.verdict or "-"),
            (t.worst_loss, _num(t.worst_loss)),
            (t.build_s, _num(t.build_s, ".3f")), (t.reason or "", t.reason or ""),
        ]
        tds = "".join(f"<td data-sort='{_e(_sort_key(k))}'>"
                      f"{route_html if i == 3 else _e(v)}</td>" for i, (k, v) in enumerate(cells))
        cls = f"o-{t.outcome.value}" + (" shipped" if t.shipped else "") + \
            (" baseline" if t.role == "baseline" else "")
        rows.append(f"<tr data-trial='{t.index}' class='{cls}'>{tds}</tr>")
    return (f"<input id='filter' type='search' placeholder='filter rows (route, outcome, "
            f"reason...)' aria-label='filter trials'> <span id='shown'>{len(e.trials)} of "
            f"{len(e.trials)} trials</span><table id='trials'><thead><tr>{head}</tr></thead>"
            f"<tbody>{''.join(rows)}</tbody></table>")


def _sort_key(value: object) -> str:
    if value is None:
        return ""
    if isinstance(value, float) and not math.isfinite(value):
        return json.dumps(str(value))
    return str(value)


_STYLE = """
body{font-family:system-ui,-apple-system,'Segoe UI',sans-serif;margin:0 auto;max-width:1200px;
padding:16px 24px;color:#1b1b1b;line-height:1.4}
h1{font-size:1.5em;margin-bottom:0} h2{font-size:1.15em;margin:1.2em 0 .3em;
border-bottom:1px solid #ddd} code{font-size:.9em;background:#f3f3f3;padding:0 3px}
.sub{color:#555;margin-top:2px} .verdict{font-size:1.15em;font-weight:600;padding:8px 12px;
border-radius:4px} .gain{background:#e6f4ea} .nogain{background:#fff4e0}
dl{display:grid;grid-template-columns:max-content auto;gap:2px 16px;margin:0}
dt{color:#555} dd{margin:0} .caption,.note{color:#555;font-size:.9em}
table{border-collapse:collapse;font-size:.85em;margin:4px 0} td,th{border:1px solid #ddd;
padding:3px 6px;text-align:left;vertical-align:top} th{background:#f5f5f5}
#trials th{cursor:pointer;user-select:none} #trials th.asc:after{content:' \\25B2'}
#trials th.desc:after{content:' \\25BC'} #filter{margin:6px 0;padding:4px;width:340px}
tr.o-ok td:nth-child(3){color:#1e7b3a;font-weight:600}
tr.o-rejected td:nth-child(3),span.o-rejected{color:#b36b00;font-weight:600}
tr.o-build_failed td:nth-child(3),tr.o-crashed td:nth-child(3),tr.o-runtime_error td:nth-child(3),
span.o-build_failed,span.o-crashed,span.o-runtime_error{color:#c62828;font-weight:600}
tr.o-timeout td:nth-child(3),span.o-timeout{color:#8e24aa;font-weight:600}
tr.o-rejected{background:#fff8ec} tr.o-build_failed,tr.o-crashed,tr.o-runtime_error,
tr.o-timeout{background:#fdeeee} tr.shipped{outline:2px solid #2e9e4f}
tr.baseline td:first-child{border-left:4px solid #1f5fbf}
.route{color:#666;font-size:.9em}.route span{white-space:nowrap}
.plots{display:grid;grid-template-columns:1fr 1fr;gap:8px 20px}.plot{min-width:0}
.plot h2{margin-top:.6em}.glance{background:#f5f7fa;padding:6px 10px;border-radius:4px}
.summary dl{font-size:.95em}
"""

_SCRIPT = """
(function () {
  var table = document.getElementById('trials');
  var body = table.tBodies[0];
  var heads = table.tHead.rows[0].cells;
  function key(row, col) { return row.cells[col].getAttribute('data-sort'); }
  function compare(a, b) {
    var x = parseFloat(a), y = parseFloat(b);
    var nx = a !== '' && !isNaN(x) && isFinite(a), ny = b !== '' && !isNaN(y) && isFinite(b);
    if (nx && ny) { return x - y; }
    if (nx !== ny) { return nx ? -1 : 1; }
    return a < b ? -1 : (a > b ? 1 : 0);
  }
  Array.prototype.forEach.call(heads, function (th) {
    th.addEventListener('click', function () {
      var col = parseInt(th.getAttribute('data-col'), 10);
      var dir = th.classList.contains('asc') ? -1 : 1;
      Array.prototype.forEach.call(heads, function (h) { h.classList.remove('asc', 'desc'); });
      th.classList.add(dir === 1 ? 'asc' : 'desc');
      var rows = Array.prototype.slice.call(body.rows);
      rows.sort(function (r1, r2) { return dir * compare(key(r1, col), key(r2, col)); });
      rows.forEach(function (r) { body.appendChild(r); });
    });
  });
  var filter = document.getElementById('filter');
  var shown = document.getElementById('shown');
  filter.addEventListener('input', function () {
    var q = filter.value.toLowerCase(), n = 0;
    Array.prototype.forEach.call(body.rows, function (r) {
      var hit = r.textContent.toLowerCase().indexOf(q) !== -1;
      r.style.display = hit ? '' : 'none';
      if (hit) { n += 1; }
    });
    shown.textContent = n + ' of ' + body.rows.length + ' trials';
  });
})();
"""

_PAGE = """<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{title}</title>
<style>{style}</style>
<script>{plotlyjs}</script>
</head><body>
<h1>{title}</h1>
<p class="sub">{subtitle}</p>
{summary}
<div class="plots">
{plots}
</div>
{details}
<h2>All trials</h2>
{table}
<script>{script}</script>
</body></html>
"""
