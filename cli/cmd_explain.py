"""``dossier explain`` and ``dossier diff``."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import typer

from dossier.formats import Document, FormatName
from dossier.run_folder import CACHE_NAME, FINGERPRINT_NAME
from dossier_cli.app import app, handled
from dossier_cli.render import choose_format, emit, err, escape, format_option, out, output_option


def _heading(text: str) -> None:
    out.print(f"\n[bold]{escape(text)}[/]")


# ------------------------------------------------------------------------------------- explain
EXPLAIN_READS = (CACHE_NAME, "routes.parquet", FINGERPRINT_NAME)
"""The records explain reads beside the manifest (checked against the file table)."""


@app.command()
@handled
def explain(
    bundle: Path = typer.Argument(..., help="Bundle folder or .dossier.tar."),
    html: Path = typer.Option(None, "--html", metavar="FILE", help="Also write the explanation with plots as one "
                              "self-contained HTML page to this file (replaced if it exists; "
                              "needs the report extra: plotly)."),
    as_json: bool = typer.Option(False, "--json", help="Print the facts as JSON on stdout "
                                 "(the Explanation model) instead of text (the same as --format "
                                 "json)."),
    fmt: FormatName = format_option(Document.explanation),
    output: Path = output_option(),
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
    from dossier.bundle.overview import altered_notes
    from dossier.bundle.reader import RECORDS_MAX_EXTRACT

    chosen = choose_format(fmt, as_json, Document.explanation, "explain", output)
    given = [flag for flag, value in (("--per-day", per_day), ("--horizon-days", horizon_days),
                                      ("--hosts", hosts)) if value is not None]
    usage = dict(inferences_per_day=per_day, horizon_days=horizon_days, hosts=hosts)
    samples = None
    with open_bundle(bundle, lazy=True, max_extract=RECORDS_MAX_EXTRACT) as b:  # no engines
        facts = explain_bundle(b, **usage)  # type: ignore[arg-type]
        for note in altered_notes(b, EXPLAIN_READS):
            err.print(f"[yellow]note:[/] {escape(note)}", soft_wrap=True)
        if html is not None or chosen.name == FormatName.html:
            from dossier.formats.report import samples_from_timings

            samples = samples_from_timings(b.timings())
    if html is not None:
        from dossier.formats import get_format
        from dossier.formats.output import write_output

        page = get_format(FormatName.html).explanation(facts, samples=samples)
        write_output(html, page, example="report.html")
        err.print(f"wrote {escape(str(html))} ({len(page.encode()) >> 10} KiB, self-contained)",
                  soft_wrap=True)
    emit(chosen.explanation(facts, given=given, samples=samples), output)


def _print_model(model: Any) -> None:
    """A model as JSON on stdout (NaN and infinities as null, so the JSON is valid)."""
    sys.stdout.write(model.model_dump_json(indent=2) + "\n")


def render_explanation(e: Any, given: Sequence[str] = ()) -> None:
    """The explanation as text on stdout; ``given``: the volume flags on the command line."""
    from dossier.formats import get_format

    emit(get_format(FormatName.text).explanation(e, given=given), None)


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
    for tag, side in (("A", d.a), ("B", d.b)):
        out.print(f"   {tag} measured under {escape(side.conditions or 'unrecorded conditions')}"
                  + (" [bold yellow](busy host)[/]" if side.busy else ""), soft_wrap=True)
    sections = {"release": "Release identity and lineage", "winner": "Shipped route",
                "speedup": "Speedup", "latency": "Latency of the shipped route (per inference)",
                "accuracy": "Accuracy of the shipped route",
                "environment": "Environment (tuning host)",
                "conditions": "Conditions of the decision's measurements", "files": "Files"}
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
