"""``dossier import trtexec`` and ``dossier export trtexec-cache``: trtexec interop."""

from __future__ import annotations

from pathlib import Path

import typer

from dossier_cli.app import app, group, handled
from dossier_cli.render import err, escape, out

import_app = group(help="Turn another tool's tuning run into a dossier bundle.")
export_app = group(help="Write a dossier search in another tool's format.")
app.add_typer(import_app, name="import")
app.add_typer(export_app, name="export")


@import_app.command("trtexec")
@handled
def import_trtexec(
    tuning_cache: Path = typer.Option(..., "--tuning-cache", metavar="FILE", help="The file trtexec wrote with "
                                      "--tuningCacheFile (TensorRT >= 11.1)."),
    engine: Path = typer.Option(None, "--engine", metavar="PLAN", help="The winner's plan: the file trtexec "
                                "copied to --saveEngine. Required: a bundle ships its engine."),
    baseline_engine: Path = typer.Option(None, "--baseline-engine", metavar="PLAN", help="The baseline's plan, "
                                         "if kept (--saveAllEngines writes SAVE.iterN); without "
                                         "it the bundle has no baseline engine."),
    knobs: Path = typer.Option(None, "--knobs", metavar="JSON", help="TensorRT's knob database JSON (trtexec "
                               "--helpBuildRoute, all_build_routes) of the TensorRT that tuned; "
                               "without it one is inferred from the cache and marked so."),
    model: Path = typer.Option(None, "--model", help="The ONNX model, when it is no longer "
                               "where the cache header says."),
    out_dir: Path = typer.Option(..., "--out", "-o", metavar="DIR", help="Folder to write NAME-VERSION.dossier "
                                 "into."),
    name: str = typer.Option(None, "--name", help="Release name (default: the ONNX file's "
                             "stem)."),
    version: int = typer.Option(1, "--version", min=1, help="Release version."),
    no_model: bool = typer.Option(False, "--no-model", help="Leave the model file out (its "
                                  "identity is still recorded)."),
    as_json: bool = typer.Option(False, "--json", help="Print the result as JSON on stdout."),
) -> None:
    """Bundle an existing trtexec tuning run as OUT/NAME-VERSION.dossier/.

    trtexec's cache records no pass/fail, no statistics, no hashes and no host, so: pass/fail
    is derived from the losses and the header's epsilon; the winner is the one trtexec picks
    (lowest mean gpu_time among passing rows, warm-up included) and is marked not
    statistically checked; the files the header names are hashed where they still exist;
    the tuning host is unknown (verify cannot compare it, so it never says VALID).
    The original cache is kept verbatim under trtexec/. A file that is not a TensorRT plan is
    refused (exit 3), and nothing is written."""
    from dossier.backends.tensorrt.importer import import_trtexec as run_import
    from dossier_cli.cmd_bundle import _report_written

    written = run_import(tuning_cache, out_dir, engine=engine, baseline_engine=baseline_engine,
                         knobs=knobs, model=model, name=name, version=version,
                         include_model=not no_model)
    _report_written(written, as_json)


@export_app.command("trtexec-cache")
@handled
def export_trtexec_cache(
    source: Path = typer.Argument(..., help="Bundle (folder or .dossier.tar), run folder, or "
                                  "dossier tuning-cache.jsonl."),
    out_file: Path = typer.Option(..., "--out", "-o", metavar="FILE", help="The trtexec tuning cache to write "
                                  "(never overwritten)."),
) -> None:
    """Write a dossier search as a trtexec tuning cache (--tuningCacheFile format): one header
    line, one line per baseline and search trial. What the format cannot hold is said on
    stderr. The file is for reading and auditing with trtexec-aware tools, not for
    trtexec --continue (its argv is empty unless the bundle was imported from trtexec)."""
    from dossier.backends.tensorrt.importer import export_trtexec_cache as run_export

    done = run_export(source, out_file)
    pick = ("no row passes trtexec's rule" if done.winner is None else
            f"trtexec's rule picks row {done.winner}: {done.winner_route or '(default route)'}")
    shipped = "" if done.shipped_route is None else \
        f"; dossier shipped {done.shipped_route or '(default route)'}"
    err.print(f"exported {done.rows} row(s); {escape(pick)}{escape(shipped)}", soft_wrap=True)
    err.print("[yellow]lost in the export:[/] " + escape("; ".join(done.loses)), soft_wrap=True)
    out.print(str(done.path), markup=False, soft_wrap=True)
