"""The ``text`` format: the terminal report of ``inspect``, ``explain`` and ``verify``.

Rendered with rich into a string: coloured (ANSI) only when asked (a terminal), plain
otherwise, lines never hard-wrapped; a table folds to ``width`` when one is given. Every piece
of text from a bundle or a host passes through :func:`~dossier.formats.escaping.printable` and
rich's markup escape.
"""

from __future__ import annotations

import io
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from dossier.formats import figures as fig
from dossier.formats.base import Document, Format
from dossier.formats.escaping import printable

if TYPE_CHECKING:
    from dossier.audit.explain import Explanation
    from dossier.bundle.overview import Overview
    from dossier.verify import VerifyReport

UNWRAPPED = 10_000
"""Width when none is given: wide enough that nothing is wrapped or cut."""
OUTCOME_STYLE = {"ok": "green", "rejected": "yellow", "build_failed": "red", "crashed": "red",
                 "timeout": "magenta", "runtime_error": "red"}
"""Colour of each trial outcome."""
VERDICT_STYLE = {"VALID": "green", "SUBOPTIMAL": "yellow", "INVALID": "red"}
"""Colour of each verify verdict."""


def escape(text: str) -> str:
    """``text`` with control characters written out and rich markup escaped."""
    from rich.markup import escape as rich_escape

    return rich_escape(printable(text))


def _r(route: str | None) -> str:
    return escape(fig.route(route))


class _Page:
    """Lines printed through a rich console into a string."""

    def __init__(self, color: bool, width: int | None) -> None:
        from rich.console import Console

        self.buffer = io.StringIO()
        self.console = Console(file=self.buffer, force_terminal=color,
                               color_system="auto" if color else None, no_color=not color,
                               width=width or UNWRAPPED, highlight=False, soft_wrap=True,
                               emoji=False, legacy_windows=False)

    def print(self, *objects: Any, **kw: Any) -> None:
        """Print like rich, every text argument made printable first."""
        kw.setdefault("soft_wrap", True)
        self.console.print(*(printable(o) if isinstance(o, str) else o for o in objects), **kw)

    def heading(self, text: str) -> None:
        self.print(f"\n[bold]{escape(text)}[/]")

    def text(self) -> str:
        return self.buffer.getvalue()


def row_lines(rows: fig.Rows, width: int) -> list[str]:
    """(label, value) rows as ``label  value`` lines, labels padded to ``width``."""
    return [f"{label.ljust(width)} {value}" for label, value in rows]


class TextFormat(Format):
    """The terminal report."""

    name = "text"
    documents = frozenset(Document)

    def __init__(self, *, color: bool = False, width: int | None = None) -> None:
        self.color = color
        """ANSI colours and bold (for a terminal)."""
        self.width = width
        """The width tables fold to (None: never folded)."""

    def _page(self) -> _Page:
        return _Page(self.color, self.width)

    # -------------------------------------------------------------------------------- inspect
    def overview(self, o: Overview) -> str:
        return "".join(printable(x) + "\n" for x in overview_lines(o))

    # -------------------------------------------------------------------------------- explain
    def explanation(self, e: Explanation, *, given: Sequence[str] = (),
                    samples: Mapping[int, Sequence[float]] | None = None) -> str:
        page = self._page()
        _explanation(page, e, given)
        return page.text()

    # --------------------------------------------------------------------------------- verify
    def verify_report(self, r: VerifyReport, *, show_all: bool = False,
                      where: str = "this host") -> str:
        if r.verdict is None:  # integrity only, or refused: the OK/FAIL lines said it all
            return ""
        page = self._page()
        _verify(page, r, show_all, where)
        return page.text()


def overview_lines(o: Overview) -> list[str]:
    """The overview as text lines (unescaped)."""
    head = fig.overview_title(o) + (f": {o.description}" if o.description else "")
    return [head, *("  " + x for x in row_lines(fig.overview_rows(o), 12))]


def _explanation(page: _Page, e: Explanation, given: Sequence[str]) -> None:
    p = page.print
    d, s, lin = e.decision, e.search, e.lineage
    p(f"[bold]{escape(lin.release)} version {lin.version}[/]: why this route")
    if not d.statistically_checked:
        p(f"[bold yellow]not statistically checked[/]: {_r(d.shipped_route)} ships "
          f"(trial {d.shipped_index}), chosen by the rule of the "
          f"{escape(e.imported_from or 'tool that searched')}")
    elif d.gain:
        p(f"[bold green]ships[/] {_r(d.shipped_route)} (trial {d.shipped_index}): "
          f"{escape(d.result)}")
    elif d.result != "no significant gain":  # the faster route failed the hold-out set
        p(f"[bold yellow]{escape(d.result)}[/] ({_r(d.shipped_route)})")
    else:
        p(f"[bold yellow]no significant gain[/]: the baseline {_r(d.shipped_route)} ships")
    p(f"  why: {escape(d.reason)}")
    for w in e.warnings:
        p(f"  [yellow]warning:[/] {escape(w)}")
    for label, value in fig.latency_rows(e):
        p(f"  {label}: {escape(value)}")
    for label, value in fig.conditions_rows(e.conditions, e.conditions_of, e.target,
                                                       e.target_note):
        p(f"  {label}: {escape(value)}")
    best = e.head_to_head
    if d.why_not and best is not None:
        where = "confirmation round" if best.source == "confirmation" else "its search trial"
        p(f"  the best candidate, {_r(best.route)} (trial {best.trial_index}, {where}), did not "
          "win:")
    for w in d.why_not:
        p(f"  - {escape(w)}")

    page.heading("Decision rule")
    p(f"  {escape(d.rule)}")

    h = e.head_to_head
    if h is not None:
        page.heading("Winner against the baseline" if h.shipped
                     else "Best candidate against the baseline (did not win)")
        for line in row_lines(fig.head_to_head_rows(h), 10):
            p("  " + escape(line))
    if e.runner_up is not None:
        r = e.runner_up
        page.heading("Runner-up")
        same = h is not None and r.route == h.route
        p(f"  {'the best candidate above' if same else _r(r.route)} (trial {r.trial_index}): "
          f"{fig.ci(r.speedup, r.speedup_ci_low, r.speedup_ci_high)} ({r.source}); the "
          f"{'shipped route' if e.decision.gain else 'baseline, which ships,'} is "
          f"{r.margin:+.1%} against it ({r.winner_speedup:.3f}x vs {r.speedup:.3f}x)")

    page.heading("Trials")
    counts = ", ".join(f"{k} {v}" for k, v in e.trial_counts.items())
    p(f"  {escape(counts)} (+{e.confirm_trials} confirmation re-measurements); "
      f"{escape(s.strategy)} over {escape(s.selection)}; accuracy: {escape(s.metric)} < "
      f"{s.threshold:g} on every output of {s.validation_pairs} pair(s)")
    base = next((t for t in e.trials if t.role == "baseline"), None)
    if base is not None and base.median_ms is not None:
        p(f"  {escape(fig.baseline_line(base))}")
    _accuracy(page, e)
    _trade(page, e)
    if e.scenario is not None:  # dossier.scenarios.curve
        page.heading(f"Under the scenario ({e.scenario.scenario})")
        from dossier.scenarios.curve import chart  # pydantic: not for the root help

        for text in [*chart(e.scenario), f"  {e.scenario.why}"]:
            page.print(escape(text))
    if e.rejected:
        page.heading(f"Rejected trials ({len(e.rejected)})")
        for t in e.rejected:
            style = OUTCOME_STYLE.get(t.outcome.value, "white")
            p(f"  #{t.index} [{style}]{t.outcome.value}[/] {_r(t.route)}")
            for f in t.failures:
                at = f"      accuracy: {escape(f.pair)}, output {escape(repr(f.output))}: "
                p(at + (f"{escape(s.metric)} loss {fig.loss_text(f.loss)} >= threshold "
                        f"{f.threshold:g}{fig.loss_cause(s.metric, f.loss)}"
                        if f.loss is not None else
                        f"NaN/Inf in the output (threshold {f.threshold:g})"))
            if not t.failures:
                p(f"      error: {escape(t.error or t.reason)}")
            if t.speedup is not None:
                p(f"      (timed all the same: {t.speedup:.3f}x)")
            if t.log:
                p(f"      log: {escape(t.log)}")

    page.heading("Knob effects, one knob at a time (trial vs the baseline timed interleaved)")
    if not e.knob_effects:
        p(f"  not measured: the {escape(e.imported_from)} has no baseline timed alongside each "
          "trial" if e.imported_from
          else "  none: no trial differs from the baseline in exactly one knob")
    width = max((len(k.knob) for k in e.knob_effects), default=0)
    for k in e.knob_effects:
        shown = fig.effect_verdict(k)
        p(f"  {escape(k.knob.ljust(width))}  {escape(k.baseline_value)} -> {escape(k.value)}: "
          f"{fig.ci(k.speedup, k.speedup_ci_low, k.speedup_ci_high)} p={k.p_value:.3g}  "
          f"{shown} (trial {k.trial_index}, {k.outcome.value}; {fig.knob_effect_source(k)})"
          + (escape("  [contention]") if k.contention_sensitive else ""))
    if e.contention_knobs:
        p(f"  [dim]contention-sensitive knobs (their effect depends on what else runs on the "
          f"host): {escape(', '.join(e.contention_knobs))}[/]")
    m = e.knob_model
    page.heading("Knob effects, model over all admissible trials")
    if not m.fitted:
        p(f"  not fitted: {escape(m.note)}")
    else:
        p(f"  [dim]{escape(m.method)}; {escape(m.note)}; R^2 "
          f"{m.r_squared if m.r_squared is None else round(m.r_squared, 3)}[/]")
        width = max(len(x.knob) for x in m.effects)
        for x in m.effects:
            p(f"  {escape(x.knob.ljust(width))}  {escape(x.reference)} -> {escape(x.value)}: "
              f"{fig.ci(x.speed_factor, x.ci_low, x.ci_high)} (SE {x.std_error:.3f} on log "
              f"scale, {x.trials} trials)")

    checks = [a for a in (e.aa_check, e.confirm_aa_check) if a is not None]
    if checks:
        page.heading("A/A check (the baseline against a second load of itself)")
    for a in checks:
        p(f"  {a.procedure}: {fig.ci(a.speedup, a.speedup_ci_low, a.speedup_ci_high)} "
          f"p={a.p_value:.3g}" + (f", {a.processes} processes" if a.processes
                                  else f", {a.rounds} rounds" if a.rounds else "")
          + f": {escape(a.verdict)}")

    page.heading("Environment the numbers were measured in (tuning host)")
    env = e.environment
    if env is None:
        p(f"  unknown: the {escape(e.imported_from)} records no host" if e.imported_from
          else "  unknown (no fingerprint)")
    else:
        for label, value in fig.environment_rows(e):
            p("  " + escape(f"{label.ljust(9)} {value}"))

    page.heading("Lineage")
    p(f"  {escape(lin.release)} version {lin.version}, dossier id {lin.dossier_id}")
    p("  parent: " + (escape(lin.parent) if lin.parent else "none: first release"))
    p(f"  created {lin.created_at} by dossier {escape(lin.tool_version)}; "
      f"{escape(lin.backend)} ({escape(lin.tuner_version)})")

    page.heading("Search cost")
    p("  " + escape(fig.cost_text(e)))
    if e.search_budget is not None:  # a budgeted search: how it spent its budget
        from dossier.audit.budget import lines as budget_lines

        page.heading("Search budget")
        for line in budget_lines(e.search_budget):
            p("  " + escape(line))

    pb = e.payback
    page.heading("Payback (search cost against benefit)")
    if pb.source != "none":
        p("  " + escape(fig.volume_text(e, given)))
    p(f"  {escape(pb.verdict)}")
    if pb.cases:
        p(f"  [dim]{escape(pb.unit)}[/]")
        for case in pb.cases:
            when = "never" if case.inferences is None else f"{case.inferences:,.0f} inferences"
            days = "" if case.days is None else f", {case.days:,.1f} days"
            p(f"  {case.case:<9} {case.speedup:.3f}x saves {case.saved_ms:.4f} ms/inference: "
              f"{when}{days}")


def _accuracy(page: _Page, e: Explanation) -> None:
    shown = fig.accuracy_trials(e)
    if not shown:
        return
    page.heading(f"Accuracy of the passing routes shown above ({e.search.metric}, per output, "
                 "worst pair)")
    for t in shown:
        page.print(f"  trial {t.index} ({fig.trial_part(e, t)}) {_r(t.route)}")
        for x in t.output_losses:
            page.print(f"      {escape(x.output)}: {fig.loss_text(x.loss)} ({escape(x.pair)}; "
                       f"threshold {e.search.threshold:g})")


def _trade(page: _Page, e: Explanation) -> None:
    t = e.trade
    if t is None:
        return
    page.heading(f"Accuracy against speed ({t.metric} < {t.threshold:g}; fastest first)")
    for line in fig.trade_head(t):
        page.print(f"  {escape(line)}")
    for pt in t.points:
        page.print(f"  {escape(fig.point_line(t, pt))}")
        for x in pt.outputs:
            page.print(f"      {escape(x.output)}: {fig.loss_text(x.loss)} ({escape(x.pair)})")


def _verify(page: _Page, r: VerifyReport, show_all: bool, where: str) -> None:
    from rich.table import Table

    assert r.verdict is not None
    groups = fig.finding_groups(r, show_all)
    table = Table(title=escape(fig.environment_title(r, where)))
    for col in ("field", "bundle", "host", "verdict", "reason"):
        table.add_column(col, overflow="fold")
    for group, f in groups:
        many = len(group) > 1
        table.add_row(escape(fig.group_field(group, f)),
                      "-" if many else escape(str(f.bundle_value)),
                      "-" if many else escape(str(f.host_value)),
                      f"[{VERDICT_STYLE[f.verdict.value]}]{f.verdict.value}[/]", escape(f.reason))
    if groups:
        page.print(table)
    page.print(fig.unchanged_line(r, where), markup=False)
    for rc in (r.recheck, r.recheck_holdout):
        if rc is not None:
            page.print(fig.recheck_line(rc), markup=False)
    if r.rebench is not None:
        page.print(fig.rebench_line(r.rebench), markup=False)
    page.print(f"verdict: [bold {VERDICT_STYLE[r.verdict.value]}]{r.verdict.value}[/]")
    for reason in r.reasons:
        page.print(f"  - {escape(reason)}")
