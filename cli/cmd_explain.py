"""``dossier explain`` and ``dossier diff``."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import typer

from dossier_cli.app import app, handled
from dossier_cli.render import err, escape, out

_OUTCOME_STYLE = {"ok": "green", "rejected": "yellow", "build_failed": "red", "crashed": "red",
                  "timeout": "magenta", "runtime_error": "red"}


def _cached(n: int) -> str:
    """The build-cache note beside the build time."""
    return (f" ({n} engine(s) from the build cache: built by an earlier search, whose build "
            "time this counts)") if n else ""


def _r(route: str | None) -> str:
    return escape(route or "(default route)")


def _ci(value: float, lo: float, hi: float, unit: str = "x", digits: int = 3) -> str:
    return f"{value:.{digits}f}{unit} [{lo:.{digits}f}, {hi:.{digits}f}]"


def _heading(text: str) -> None:
    out.print(f"\n[bold]{escape(text)}[/]")


# ------------------------------------------------------------------------------------- explain
@app.command()
@handled
def explain(
    bundle: Path = typer.Argument(..., help="Bundle folder or .dossier.tar."),
    html: Path = typer.Option(None, "--html", metavar="FILE", help="Also write the explanation with plots as one "
                              "self-contained HTML page to this file (replaced if it exists; "
                              "needs the report extra: plotly)."),
    as_json: bool = typer.Option(False, "--json", help="Print the facts as JSON on stdout "
                                 "(the Explanation model) instead of text."),
    per_day: float = typer.Option(None, "--per-day", min=0, help="Expected inferences per day "
                                  "on one host (overrides the spec's [deployment] inferences_per_day)."),
    horizon_days: float = typer.Option(None, "--horizon-days", min=0.001, help="How many days "
                                       "the release is expected to serve (overrides horizon_days)."),
    hosts: int = typer.Option(None, "--hosts", min=1, help="Hosts it serves on; savings accrue on "
                              "each (overrides hosts)."),
) -> None:
    """Why this route: the decision rule applied, winner against baseline with intervals and
    the test used, runner-up, every rejected trial and why, each knob's effect, the tuning
    host, lineage, the A/A check, the search's cost and when it pays back.

    Everything comes from what the bundle recorded; nothing is re-measured.
    """
    from dossier.audit import explain as explain_bundle
    from dossier.bundle import open_bundle
    from dossier.bundle.reader import RECORDS_MAX_EXTRACT

    usage = dict(inferences_per_day=per_day, horizon_days=horizon_days, hosts=hosts)
    with open_bundle(bundle, lazy=True, max_extract=RECORDS_MAX_EXTRACT) as b:  # no engines
        facts = explain_bundle(b, **usage)  # type: ignore[arg-type]
        page = None
        if html is not None:
            from dossier.audit.report import render_report, samples_from_timings, write_page

            page = render_report(facts, samples_from_timings(b.timings()))
    if page is not None:
        write_page(html, page)
        err.print(f"wrote {escape(str(html))} ({len(page.encode()) >> 10} KiB, self-contained)",
                  soft_wrap=True)
    if as_json:
        _print_model(facts)
        return
    render_explanation(facts, [flag for flag, value in (("--per-day", per_day),
                                                        ("--horizon-days", horizon_days),
                                                        ("--hosts", hosts)) if value is not None])


def _print_model(model: Any) -> None:
    """A model as JSON on stdout (NaN and infinities as null, so the JSON is valid)."""
    sys.stdout.write(model.model_dump_json(indent=2) + "\n")


def volume_origin(source: str, given: Sequence[str] = ()) -> str:
    """Where the payback's volume came from: inferences/day from --per-day or the spec, and
    horizon and hosts each from its flag or else the spec's [deployment] (or its default)."""
    parts = [f"inferences/day from {'--per-day' if source == 'flags' else 'the spec'}"]
    flagged = [(flag, what) for flag, what in (("--horizon-days", "horizon"), ("--hosts", "hosts"))
               if flag in given]
    parts += [f"{what} from {flag}" for flag, what in flagged]
    rest = [what for flag, what in (("--horizon-days", "horizon"), ("--hosts", "hosts"))
            if flag not in given]
    if rest:
        parts.append(f"{' and '.join(rest)} from the spec's [deployment] or "
                     f"{'their defaults' if len(rest) > 1 else 'its default'}")
    return "; ".join(parts)


def render_explanation(e: Any, given: Sequence[str] = ()) -> None:
    """The explanation as text on stdout; ``given``: the volume flags on the command line."""
    from dossier.audit.explain import shown_verdict, test_name

    d, s, lin = e.decision, e.search, e.lineage
    out.print(f"[bold]{escape(lin.release)} version {lin.version}[/]: why this route",
              soft_wrap=True)
    if not d.statistically_checked:
        out.print(f"[bold yellow]not statistically checked[/]: {_r(d.shipped_route)} ships "
                  f"(trial {d.shipped_index}), chosen by the rule of the "
                  f"{escape(e.imported_from or 'tool that searched')}", soft_wrap=True)
    elif d.gain:
        out.print(f"[bold green]ships[/] {_r(d.shipped_route)} (trial {d.shipped_index}): "
                  f"{escape(d.result)}", soft_wrap=True)
    else:
        out.print(f"[bold yellow]no significant gain[/]: the baseline "
                  f"{_r(d.shipped_route)} ships", soft_wrap=True)
    out.print(f"  why: {escape(d.reason)}", soft_wrap=True)
    if d.why_not and e.head_to_head is not None:
        h = e.head_to_head
        where = "confirmation round" if h.source == "confirmation" else "its search trial"
        out.print(f"  the best candidate, {_r(h.route)} (trial {h.trial_index}, {where}), "
                  "did not win:", soft_wrap=True)
    for w in d.why_not:
        out.print(f"  - {escape(w)}", soft_wrap=True)

    _heading("Decision rule")
    out.print(f"  {escape(d.rule)}", soft_wrap=True)

    h = e.head_to_head
    if h is not None:
        _heading("Winner against the baseline" if h.shipped
                 else "Best candidate against the baseline (did not win)")
        src = (("confirmation: measuring processes of their own, each with the baseline and "
                "its A/A load" if h.processes else
                "independent confirmation: one fresh process per engine")
               if h.source == "confirmation" else "screening: its search trial")
        unit = f"{h.processes} measuring processes" if h.processes else f"{h.rounds or '?'} rounds"
        over = "the A/A load" if h.against == "aa" else "the baseline"
        test = test_name(h.test)
        lines = [
            f"candidate  {_r(h.route)} (trial {h.trial_index})",
            f"measured   {src} (record {h.measured_in})",
            f"candidate  median {_ci(h.candidate.median_ms, h.candidate.ci_low_ms, h.candidate.ci_high_ms, ' ms', 4)} (n={h.candidate.n})",
            f"baseline   median {_ci(h.baseline.median_ms, h.baseline.ci_low_ms, h.baseline.ci_high_ms, ' ms', 4)} (n={h.baseline.n}), "
            f"timed alongside it in record {h.measured_in}",
            f"speedup    {_ci(h.speedup, h.speedup_ci_low, h.speedup_ci_high)} over {over} "
            f"({h.confidence:.0%} interval over {unit}"
            + (", includes 1.0)" if h.interval_includes_one else ")"),
        ] + ([f"rounds     each round's ratio between {h.round_ratio_low:.3f}x and "
              f"{h.round_ratio_high:.3f}x"]
             if h.round_ratio_low is not None and h.round_ratio_high is not None else []) + (
            [f"processes  {len(h.generation_speedups)} process generations read "
             + ", ".join(f"{g:.3f}x" for g in h.generation_speedups)
             + "; the interval also covers a new generation's reading"]
            if h.generation_speedups else []) + (
            ["processes  each process read "
             + ", ".join(f"{g:.3f}x" for g in h.process_speedups)
             + (f"; a new process is expected to read {h.prediction_low:.3f}x to "
                f"{h.prediction_high:.3f}x ({h.confidence:.0%} prediction interval)"
                if h.prediction_low is not None and h.prediction_high is not None else "")]
            if h.process_speedups else []) + [
            f"test       {test}: p={h.p_value:.3g} against alpha={h.alpha:.3g} "
            f"({'significant' if h.significant else 'not significant'}); {min_effect_text(h)}",
        ] + ([f"verdict    {h.verdict}"] if h.verdict else [])
        for line in lines:
            out.print("  " + line, soft_wrap=True)
    if e.runner_up is not None:
        r = e.runner_up
        _heading("Runner-up")
        same = h is not None and r.route == h.route
        out.print(f"  {'the best candidate above' if same else _r(r.route)} (trial {r.trial_index}): "
                  f"{_ci(r.speedup, r.speedup_ci_low, r.speedup_ci_high)} ({r.source}); the "
                  f"{'shipped route' if e.decision.gain else 'baseline, which ships,'} is "
                  f"{r.margin:+.1%} against it ({r.winner_speedup:.3f}x vs "
                  f"{r.speedup:.3f}x)", soft_wrap=True)

    _heading("Trials")
    counts = ", ".join(f"{k} {v}" for k, v in e.trial_counts.items())
    out.print(f"  {escape(counts)} (+{e.confirm_trials} confirmation re-measurements); "
              f"{escape(s.strategy)} over {escape(s.selection)}; accuracy: {escape(s.metric)} < "
              f"{s.threshold:g} on every output of {s.validation_pairs} pair(s)", soft_wrap=True)
    base = next((t for t in e.trials if t.role == "baseline"), None)
    if base is not None and base.median_ms is not None:
        out.print(f"  {escape(baseline_line(base))}", soft_wrap=True)
    _accuracy_lines(e)
    if e.rejected:
        _heading(f"Rejected trials ({len(e.rejected)})")
        for t in e.rejected:
            style = _OUTCOME_STYLE.get(t.outcome.value, "white")
            out.print(f"  #{t.index} [{style}]{t.outcome.value}[/] {_r(t.route)}", soft_wrap=True)
            if t.failures:
                for f in t.failures:
                    loss = "NaN/Inf" if f.loss is None else f"{f.loss:.3g}"
                    out.print(f"      accuracy: {escape(f.pair)}, output {escape(repr(f.output))}: "
                              f"{escape(s.metric)} loss {loss} >= threshold {f.threshold:g}"
                              if f.loss is not None else
                              f"      accuracy: {escape(f.pair)}, output {escape(repr(f.output))}: "
                              f"{loss} in the output (threshold {f.threshold:g})", soft_wrap=True)
            else:
                out.print(f"      error: {escape(t.error or t.reason)}", soft_wrap=True)
            if t.speedup is not None:
                out.print(f"      (timed all the same: {t.speedup:.3f}x)", soft_wrap=True)

    _heading("Knob effects, one knob at a time (trial vs the baseline timed interleaved)")
    if not e.knob_effects:
        out.print(f"  not measured: the {escape(e.imported_from)} has no baseline timed "
                  "alongside each trial" if e.imported_from
                  else "  none: no trial differs from the baseline in exactly one knob",
                  soft_wrap=True)
    width = max((len(k.knob) for k in e.knob_effects), default=0)
    for k in e.knob_effects:
        out.print(f"  {escape(k.knob.ljust(width))}  {escape(k.baseline_value)} -> "
                  f"{escape(k.value)}: {_ci(k.speedup, k.speedup_ci_low, k.speedup_ci_high)} "
                  f"p={k.p_value:.3g}  {shown_verdict(k.verdict, 'search')} (trial {k.trial_index}, "
                  f"{k.outcome.value})", soft_wrap=True)
    m = e.knob_model
    _heading("Knob effects, model over all admissible trials")
    if not m.fitted:
        out.print(f"  not fitted: {escape(m.note)}", soft_wrap=True)
    else:
        out.print(f"  [dim]{escape(m.method)}; {escape(m.note)}; R^2 "
                  f"{m.r_squared if m.r_squared is None else round(m.r_squared, 3)}[/]",
                  soft_wrap=True)
        width = max(len(x.knob) for x in m.effects)
        for x in m.effects:
            out.print(f"  {escape(x.knob.ljust(width))}  {escape(x.reference)} -> "
                      f"{escape(x.value)}: {_ci(x.speed_factor, x.ci_low, x.ci_high)} "
                      f"(SE {x.std_error:.3f} on log scale, {x.trials} trials)", soft_wrap=True)

    checks = [a for a in (e.aa_check, e.confirm_aa_check) if a is not None]
    if checks:
        _heading("A/A check (the baseline against a second load of itself)")
    for a in checks:
        out.print(f"  {a.procedure}: {_ci(a.speedup, a.speedup_ci_low, a.speedup_ci_high)} "
                  f"p={a.p_value:.3g}" + (f", {a.processes} processes" if a.processes
                                           else f", {a.rounds} rounds" if a.rounds else "")
                  + f": {escape(a.verdict)}", soft_wrap=True)

    _heading("Environment the numbers were measured in (tuning host)")
    env = e.environment
    if env is None:
        out.print(f"  unknown: the {escape(e.imported_from)} records no host" if e.imported_from
                  else "  unknown (no fingerprint)", soft_wrap=True)
    else:
        gpus = "; ".join(f"{g.name} (cc {g.compute_capability}, {g.memory_total_mib} MiB, "
                         f"driver {g.driver_version})" for g in env.gpus) or "none"
        for line in (
                f"host      {env.hostname}",
                f"CPU       {env.cpu} ({env.cpu_vendor}), {env.cores} logical / "
                f"{env.physical_cores} physical cores; {' '.join(env.isa_flags)}",
                f"OS        {env.os}, kernel {env.kernel}, {env.machine}, glibc {env.glibc}",
                f"Python    {env.python}",
                f"packages  {', '.join(f'{k} {v}' for k, v in env.packages.items())}",
                f"GPU       {gpus}" + (f"; CUDA runtime {env.cuda_runtime}"
                                       if env.cuda_runtime else "")):
            out.print("  " + escape(line), soft_wrap=True)

    _heading("Lineage")
    out.print(f"  {escape(lin.release)} version {lin.version}, dossier id {lin.dossier_id}",
              soft_wrap=True)
    out.print("  parent: " + (escape(lin.parent) if lin.parent else "none: first release"),
              soft_wrap=True)
    out.print(f"  created {lin.created_at} by dossier {escape(lin.tool_version)}; "
              f"{escape(lin.backend)} ({escape(lin.tuner_version)})", soft_wrap=True)

    c = e.cost
    _heading("Search cost")
    if e.imported_from:
        out.print(f"  unknown: the {escape(e.imported_from)} records no wall or build times; "
                  f"{c.trials} trials", soft_wrap=True)
    else:
        out.print(f"  search wall time {c.search_wall_s:.1f} s over {c.sessions} session(s); "
                  f"builds {c.build_s:.1f} s{_cached(c.cached_builds)}; "
                  f"measurement {c.measure_s:.1f} s (confirmation round "
                  f"{c.confirm_s:.1f} s); {c.trials} trials + {c.confirm_trials} confirmation",
                  soft_wrap=True)

    p = e.payback
    _heading("Payback (search cost against benefit)")
    if p.source != "none":
        out.print(f"  volume: {p.inferences_per_day:,.0f} inferences/day on {p.hosts} host(s), "
                  f"horizon {p.horizon_days:g} days ({escape(volume_origin(p.source, given))})",
                  soft_wrap=True)
    out.print(f"  {escape(p.verdict)}", soft_wrap=True)
    if p.cases:
        out.print(f"  [dim]{escape(p.unit)}[/]", soft_wrap=True)
        for x in p.cases:
            when = "never" if x.inferences is None else f"{x.inferences:,.0f} inferences"
            days = "" if x.days is None else f", {x.days:,.1f} days"
            out.print(f"  {x.case:<9} {x.speedup:.3f}x saves {x.saved_ms:.4f} ms/inference: "
                      f"{when}{days}", soft_wrap=True)


def min_effect_text(h: Any) -> str:
    """Whether the minimum effect of a gain was reached; a slowdown says so instead."""
    if h.speedup < 1:
        return f"minimum effect {h.min_effect:.0%}: a slowdown ({h.speedup:.3f}x), not a gain"
    return f"minimum effect {h.min_effect:.0%} {'reached' if h.reaches_min_effect else 'not reached'}"


def baseline_line(base: Any) -> str:
    """The summary's baseline figure, named the same in inspect, explain and the HTML."""
    return (f"baseline (trial {base.index}) {base.median_ms:.3f} ms [{base.ci_low_ms:.3f}, "
            f"{base.ci_high_ms:.3f}] (n={base.n}); each speedup compares a trial with the "
            "baseline timed alongside it")


def _accuracy_lines(e: Any) -> None:
    shown = [t for t in e.trials if t.role != "confirm" and t.output_losses
             and t.outcome.value == "ok" and (t.shipped or t.role == "baseline"
                                              or (e.head_to_head is not None
                                                  and t.index == e.head_to_head.trial_index))]
    if not shown:
        return
    _heading(f"Accuracy of the passing routes shown above ({e.search.metric}, per output, "
             "worst pair)")
    for t in shown:
        what = "shipped" if t.shipped else "baseline" if t.role == "baseline" else "candidate"
        out.print(f"  trial {t.index} ({what}) {_r(t.route)}", soft_wrap=True)
        for x in t.output_losses:
            loss = "NaN/Inf" if x.loss is None else f"{x.loss:.3g}"
            out.print(f"      {escape(x.output)}: {loss} ({escape(x.pair)}; threshold "
                      f"{e.search.threshold:g})", soft_wrap=True)


# ---------------------------------------------------------------------------------------- diff
@app.command(name="diff")
@handled
def diff_cmd(
    a: Path = typer.Argument(..., help="Bundle A (folder or .dossier.tar), e.g. the older one."),
    b: Path = typer.Argument(..., help="Bundle B, e.g. the newer one."),
    as_json: bool = typer.Option(False, "--json", help="Print the differences as JSON."),
) -> None:
    """What changed from bundle A to bundle B: release identity and lineage, the shipped route
    knob by knob, speedup and interval, accuracy of the shipped route, the tuning host (each
    changed field with the verdict B's backend's default verify policy gives it) and files
    (added, removed, changed digest). Works across versions and across releases.

    Exit 0 whether or not they differ (a diff reports; it does not judge). Integrity is not
    checked here: dossier verify does that.
    """
    from dossier.audit import diff_bundles
    from dossier.bundle import open_bundle
    from dossier.bundle.reader import RECORDS_MAX_EXTRACT

    with open_bundle(a, lazy=True, max_extract=RECORDS_MAX_EXTRACT) as ba, \
            open_bundle(b, lazy=True, max_extract=RECORDS_MAX_EXTRACT) as bb:
        result = diff_bundles(ba, bb)
    if as_json:
        _print_model(result)
        return
    render_diff(result)


def render_diff(d: Any) -> None:
    """A bundle diff as text on stdout."""
    for tag, side in (("A", d.a), ("B", d.b)):
        out.print(f"{tag}  {escape(side.release)} version {side.version}  id {side.dossier_id}  "
                  f"{escape(side.bundle)}", soft_wrap=True)
    out.print(f"   {escape(d.relation)}", soft_wrap=True)
    sections = {"release": "Release identity and lineage", "winner": "Shipped route",
                "speedup": "Speedup", "accuracy": "Accuracy of the shipped route",
                "environment": "Environment (tuning host)", "files": "Files"}
    by: dict[str, list[Any]] = {}
    for c in d.changes:
        by.setdefault(c.section, []).append(c)
    for key, title in sections.items():
        _heading(title)
        if key == "winner":
            width = max((len(r.knob) for r in d.winner), default=0)
            for r in d.winner:
                mark = "[bold]changed[/]" if r.changed else "[dim]same[/]"
                out.print(f"  {escape(r.knob.ljust(width))}  {escape(str(r.a))} -> "
                          f"{escape(str(r.b))}  {mark}", soft_wrap=True)
            continue
        items = by.get(key, [])
        if key == "environment":
            out.print(f"  verdict for B's engine: {d.environment_verdict.value} "
                      f"([dim]{escape(d.policy_note)}[/])", soft_wrap=True)
        if not items:
            out.print("  no change")
        for c in items:
            if key == "files":
                sign = {"added": "+", "removed": "-", "changed": "~"}.get(c.note or "", "~")
                out.print(f"  {sign} {escape(c.field)}  ({c.note})", soft_wrap=True)
            elif key == "environment":
                out.print(f"  {escape(c.field)}: {escape(str(c.a))} -> {escape(str(c.b))}  "
                          f"{c.verdict.value}: {escape(c.note or '')}", soft_wrap=True)
            else:
                out.print(f"  {escape(c.field)}: {escape(str(c.a))} -> {escape(str(c.b))}",
                          soft_wrap=True)
    n = len(d.changes)
    out.print(f"\n{n} field(s) differ" if d.differs else "\nno difference", soft_wrap=True)
