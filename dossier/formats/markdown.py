"""The ``markdown`` format: GitHub-flavoured Markdown for a CI job summary
(``>> $GITHUB_STEP_SUMMARY``) or a pull-request comment.

Headings, short paragraphs and pipe tables; every piece of text from a bundle or a host is
escaped (:func:`~dossier.formats.escaping.markdown`), so a route, a file name or a reason
cannot open a link, an HTML tag or a new table cell. The figures and their names are those of
the text format (:mod:`dossier.formats.figures`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from dossier.formats import figures as fig
from dossier.formats.base import Document, Format
from dossier.formats.escaping import markdown as md

if TYPE_CHECKING:
    from dossier.audit.explain import Explanation
    from dossier.bundle.overview import Overview
    from dossier.verify import VerifyReport


def table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    """A pipe table: ``header`` and ``rows`` are plain text, escaped here. A table needs at
    least one row; without any, nothing."""
    if not rows:
        return []
    return ["| " + " | ".join(md(h) for h in header) + " |",
            "|" + "|".join(" --- " for _ in header) + "|",
            *("| " + " | ".join(md(c) for c in row) + " |" for row in rows), ""]


def pairs(rows: fig.Rows, header: tuple[str, str] = ("", "")) -> list[str]:
    """(label, value) rows as a two-column table."""
    return table(header, rows)


def para(text: str) -> list[str]:
    """One paragraph of plain text, escaped."""
    return [md(text), ""]


def items(texts: Sequence[str]) -> list[str]:
    """A bullet list of plain texts, escaped."""
    return [*(f"- {md(t)}" for t in texts), ""] if texts else []


def heading(text: str, level: int = 3) -> list[str]:
    return ["#" * level + " " + md(text), ""]


def _join(lines: list[str]) -> str:
    while lines and lines[-1] == "":
        lines.pop()
    return "\n".join(lines) + "\n"


class MarkdownFormat(Format):
    """GitHub-flavoured Markdown."""

    name = "markdown"
    documents = frozenset(Document)

    def overview(self, o: Overview) -> str:
        lines = heading(fig.overview_title(o), 2)
        if o.description:
            lines += para(o.description)
        lines += pairs(fig.overview_rows(o), ("field", "value"))
        lines += [f"- **note:** {md(n)}" for n in o.notes]
        return _join(lines)

    def explanation(self, e: Explanation, *, given: Sequence[str] = (),
                    samples: Mapping[int, Sequence[float]] | None = None) -> str:
        return _join(_explanation(e, given))

    def verify_report(self, r: VerifyReport, *, show_all: bool = False,
                      where: str = "this host") -> str:
        return _join(_verify(r, show_all, where))


def _explanation(e: Explanation, given: Sequence[str]) -> list[str]:
    d, s, lin = e.decision, e.search, e.lineage
    lines = heading(f"{lin.release} version {lin.version}: why this route", 2)
    if not d.statistically_checked:
        lines.append(f"**not statistically checked**: {md(fig.route(d.shipped_route))} ships "
                     f"(trial {d.shipped_index}), chosen by the rule of the "
                     f"{md(e.imported_from or 'tool that searched')}")
    elif d.gain:
        lines.append(f"**ships** {md(fig.route(d.shipped_route))} (trial {d.shipped_index}): "
                     f"{md(d.result)}")
    elif d.result != "no significant gain":  # the faster route failed the hold-out set
        lines.append(f"**{md(d.result)}** ({md(fig.route(d.shipped_route))})")
    else:
        lines.append(f"**no significant gain**: the baseline {md(fig.route(d.shipped_route))} "
                     "ships")
    lines += ["", f"why: {md(d.reason)}", ""]
    lines += [f"warning: {md(w)}" + "  " for w in e.warnings]
    lines += [""] if e.warnings else []
    lines += [f"{label}: {md(value)}" + "  " for label, value in
              [*fig.latency_rows(e), *fig.conditions_rows(e.conditions, e.conditions_of, e.target,
                                                       e.target_note)]]
    lines += [""]
    h = e.head_to_head
    if d.why_not and h is not None:
        where = "confirmation round" if h.source == "confirmation" else "its search trial"
        lines += para(f"the best candidate, {fig.route(h.route)} (trial {h.trial_index}, "
                      f"{where}), did not win:")
    lines += items(d.why_not)
    lines += heading("Decision rule") + para(d.rule)
    if h is not None:
        lines += heading("Winner against the baseline" if h.shipped
                         else "Best candidate against the baseline (did not win)")
        lines += pairs(fig.head_to_head_rows(h))
    if e.runner_up is not None:
        r = e.runner_up
        same = h is not None and r.route == h.route
        lines += heading("Runner-up") + para(
            f"{'the best candidate above' if same else fig.route(r.route)} (trial "
            f"{r.trial_index}): {fig.ci(r.speedup, r.speedup_ci_low, r.speedup_ci_high)} "
            f"({r.source}); the {'shipped route' if d.gain else 'baseline, which ships,'} is "
            f"{r.margin:+.1%} against it ({r.winner_speedup:.3f}x vs {r.speedup:.3f}x)")

    lines += heading("Trials")
    counts = ", ".join(f"{k} {v}" for k, v in e.trial_counts.items())
    lines += para(f"{counts} (+{e.confirm_trials} confirmation re-measurements); {s.strategy} "
                  f"over {s.selection}; accuracy: {s.metric} < {s.threshold:g} on every output "
                  f"of {s.validation_pairs} pair(s)")
    base = next((t for t in e.trials if t.role == "baseline"), None)
    if base is not None and base.median_ms is not None:
        lines += para(fig.baseline_line(base))
    shown = fig.accuracy_trials(e)
    if shown:
        lines += heading(f"Accuracy of the passing routes shown above ({s.metric}, per output, "
                         f"worst pair; threshold {s.threshold:g})")
        lines += table(("trial", "route", "output", "loss", "pair"),
                       [(f"{t.index} ({fig.trial_part(e, t)})", fig.route(t.route), x.output,
                         fig.loss_text(x.loss), x.pair) for t in shown for x in t.output_losses])
    if e.trade is not None:
        lines += heading(f"Accuracy against speed ({e.trade.metric} < {e.trade.threshold:g}; "
                         "fastest first)")
        lines += para(" ".join(fig.trade_head(e.trade)))
        lines += [f"- {fig.point_line(e.trade, p)}" for p in e.trade.points] + [""]
    if e.rejected:
        lines += heading(f"Rejected trials ({len(e.rejected)})")
        rows = []
        for t in e.rejected:
            why = "; ".join(
                (f"accuracy: {f.pair}, output {f.output!r}: {s.metric} loss "
                 f"{fig.loss_text(f.loss)} >= threshold {f.threshold:g}"
                 f"{fig.loss_cause(s.metric, f.loss)}" if f.loss is not None
                 else f"accuracy: {f.pair}, output {f.output!r}: NaN/Inf in the output "
                      f"(threshold {f.threshold:g})") for f in t.failures
            ) or f"error: {t.error or t.reason}"
            why += f" (log: {t.log})" if t.log else ""
            rows.append((f"#{t.index}", t.outcome.value, fig.route(t.route), why,
                         "-" if t.speedup is None else f"{t.speedup:.3f}x"))
        lines += table(("trial", "outcome", "route", "why", "timed all the same"), rows)

    lines += heading("Knob effects, one knob at a time (trial vs the baseline timed interleaved)")
    if not e.knob_effects:
        lines += para(f"not measured: the {e.imported_from} has no baseline timed alongside "
                      "each trial" if e.imported_from
                      else "none: no trial differs from the baseline in exactly one knob")
    lines += table(("knob", "baseline value", "value", "speedup", "p", "verdict", "measured",
                    "trial"),
                   [(k.knob + (" [contention]" if k.contention_sensitive else ""),
                     k.baseline_value, k.value,
                     fig.ci(k.speedup, k.speedup_ci_low, k.speedup_ci_high), f"{k.p_value:.3g}",
                     fig.effect_verdict(k), fig.knob_effect_source(k),
                     f"{k.trial_index} ({k.outcome.value})") for k in e.knob_effects])
    m = e.knob_model
    lines += heading("Knob effects, model over all admissible trials")
    if not m.fitted:
        lines += para(f"not fitted: {m.note}")
    else:
        r2 = m.r_squared if m.r_squared is None else round(m.r_squared, 3)
        lines += para(f"{m.method}; {m.note}; R^2 {r2}")
        lines += table(("knob", "reference", "value", "speed factor", "SE on log scale",
                        "trials"),
                       [(x.knob, x.reference, x.value, fig.ci(x.speed_factor, x.ci_low, x.ci_high),
                         f"{x.std_error:.3f}", str(x.trials)) for x in m.effects])

    checks = [a for a in (e.aa_check, e.confirm_aa_check) if a is not None]
    if checks:
        lines += heading("A/A check (the baseline against a second load of itself)")
        lines += table(("procedure", "speedup", "p", "over", "verdict"),
                       [(a.procedure, fig.ci(a.speedup, a.speedup_ci_low, a.speedup_ci_high),
                         f"{a.p_value:.3g}", f"{a.processes} processes" if a.processes
                         else f"{a.rounds} rounds" if a.rounds else "-", a.verdict)
                        for a in checks])

    lines += heading("Environment the numbers were measured in (tuning host)")
    if e.environment is None:
        lines += para(f"unknown: the {e.imported_from} records no host" if e.imported_from
                      else "unknown (no fingerprint)")
    lines += pairs(fig.environment_rows(e))

    lines += heading("Lineage")
    lines += pairs([("release", f"{lin.release} version {lin.version}"),
                    ("dossier id", lin.dossier_id or "-"),
                    ("parent", lin.parent or "none: first release"),
                    ("created", f"{lin.created_at} by dossier {lin.tool_version}; {lin.backend} "
                                f"({lin.tuner_version})")])

    lines += heading("Search cost") + para(fig.cost_text(e))

    pb = e.payback
    lines += heading("Payback (search cost against benefit)")
    if pb.source != "none":
        lines += para(fig.volume_text(e, given))
    lines += para(pb.verdict)
    if pb.cases:
        lines += para(pb.unit)
        lines += table(("case", "speedup", "saves (ms/inference)", "pays back after"),
                       [(x.case, f"{x.speedup:.3f}x", f"{x.saved_ms:.4f}",
                         ("never" if x.inferences is None else f"{x.inferences:,.0f} inferences")
                         + ("" if x.days is None else f", {x.days:,.1f} days"))
                        for x in pb.cases])
    return lines


def _verify(r: VerifyReport, show_all: bool, where: str) -> list[str]:
    name = f"{r.release} ({r.backend})" if r.release else r.source or r.bundle
    verdict = r.verdict.value if r.verdict is not None else (
        "refused" if r.error else "integrity checked")
    lines = heading(f"verify: {name} on {where}: {verdict}", 2)
    if r.error:
        lines += [f"**refused** (exit {r.exit_code}): {md(r.error)}", ""]
    elif r.verdict is not None:
        lines += [f"**verdict: {r.verdict.value}** (exit {r.exit_code})", ""]
    lines += items(r.reasons)
    lines += table(("step", "outcome", "detail"),
                   [(s.name.value, s.outcome.value,
                     s.detail + "".join(f"; {p}" for p in s.problems)) for s in r.steps])
    if r.verdict is not None and r.findings:
        groups = fig.finding_groups(r, show_all)
        lines += heading(fig.environment_title(r, where))
        lines += table(("field", "bundle", "host", "verdict", "reason"),
                       [(fig.group_field(g, f), "-" if len(g) > 1 else str(f.bundle_value),
                         "-" if len(g) > 1 else str(f.host_value), f.verdict.value, f.reason)
                        for g, f in groups])
        lines += para(fig.unchanged_line(r, where))
    for rc in (r.recheck, r.recheck_holdout):
        if rc is not None:
            lines += para(fig.recheck_line(rc))
    if r.rebench is not None:
        lines += para(fig.rebench_line(r.rebench))
    return lines
