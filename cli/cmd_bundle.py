"""``dossier release``, ``bundle``, ``inspect``, ``verify``, ``pack`` and ``schema``."""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Any

import typer

from dossier.errors import ExitCode
from dossier.formats import Document, FormatName
from dossier_cli.app import app, handled, on_interrupt
from dossier_cli.cmd_tune import (
    address_option,
    build_cache_option,
    executor_option,
    max_builds_option,
    max_search_s_option,
    print_notes,
)
from dossier_cli.render import (
    choose_format,
    emit,
    err,
    escape,
    format_option,
    out,
    output_option,
    print_json,
)


def _report_written(written: Any, as_json: bool, strict_conditions: bool = False) -> None:
    m = written.manifest
    for w in m.warnings:
        err.print(f"[yellow]warning:[/] {escape(w)}", soft_wrap=True)
    note, busy = _conditions_line(written.path)
    if busy:
        err.print(f"[yellow]busy host:[/] {escape(busy)}", soft_wrap=True)
    if as_json:
        print_json({"bundle": str(written.path), "dossier_id": m.dossier_id,
                    "release": m.release, "version": m.release_version, "parent": m.parent,
                    "result": m.summary.result, "warnings": list(m.warnings),
                    "comparable": note is None, "not_comparable": note})
    else:
        err.print(f"bundled {escape(m.name)}: id {m.dossier_id}, {len(m.files)} files + "
                  f"manifest; {escape(m.summary.result)}", soft_wrap=True)
        out.print(str(written.path), markup=False, soft_wrap=True)
    if note:  # the last line: the figures do not hold for the declared target
        err.print(f"[bold yellow]{escape(note)}[/]", soft_wrap=True)
        if strict_conditions:
            raise typer.Exit(int(ExitCode.CONDITIONS))


def _conditions_line(path: Path) -> tuple[str | None, str | None]:
    """(the line a bundle whose figures do not hold for its declared target gets, the busy-host
    line of a bundle from before targets were declared); None where there is nothing to say."""
    from dossier.bundle import open_bundle
    from dossier.bundle.overview import decision_conditions, target_facts
    from dossier.formats.figures import busy_line

    with open_bundle(path, lazy=True) as b:
        cache = b.tuning_cache()
        trials = list(cache.trials)
        c, of = decision_conditions(trials)
        _, note = target_facts(cache.header.spec.target, cache.decision, trials)
        recorded = cache.decision is not None and cache.decision.estimator is not None
    if recorded:
        return note, None
    return None, busy_line(c, of) if c is not None and c.busy else None


# -------------------------------------------------------------------------------------- bundle
@app.command()
@handled
def bundle(
    source: Path = typer.Argument(..., metavar="RUN", help="A finished run folder (dossier tune --out) or its "
                                  "tuning-cache.jsonl."),
    out_dir: Path = typer.Option(..., "--out", "-o", metavar="DIR", help="Folder to write NAME-VERSION.dossier "
                                 "into."),
    parent: str = typer.Option(None, "--parent", help="Dossier id of the bundle this release "
                               "replaces."),
    no_model: bool = typer.Option(False, "--no-model", help="Leave the model file out (its "
                                  "identity is still recorded)."),
    as_json: bool = typer.Option(False, "--json", help="Print the result as JSON on stdout."),
) -> None:
    """Bundle a finished search as OUT/NAME-VERSION.dossier/: engines, model identity,
    knob database, every trial, raw timings, shapes, validation set, tuning cache, host
    fingerprint, and a manifest with every file's size and xxh3-128."""
    from dossier.backends import describe
    from dossier.bundle import write_bundle

    written = write_bundle(source, out_dir, parent=parent, include_model=not no_model,
                           describe=describe)
    _report_written(written, as_json)


# ------------------------------------------------------------------------------------- release
@app.command()
@handled
def release(
    spec: Path = typer.Argument(..., metavar="SPEC", help="Release spec (release.toml)."),
    out_dir: Path = typer.Option(..., "--out", "-o", metavar="DIR", help="Folder to write NAME-VERSION.dossier "
                                 "into."),
    work: Path = typer.Option(None, "--work", metavar="RUN", help="Run folder of the search (default: "
                              "OUT/.runs/NAME-VERSION). A search already there is continued."),
    parent: str = typer.Option(None, "--parent", help="Dossier id of the bundle this release "
                               "replaces."),
    no_model: bool = typer.Option(False, "--no-model", help="Leave the model file out."),
    as_json: bool = typer.Option(False, "--json", help="Print the result as JSON on stdout."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="No per-trial lines on stderr."),
    build_jobs: int = typer.Option(None, "--build-jobs", "-j", min=1, help="Builds that run at "
                                   "once (default: from the cores); see dossier tune."),
    executor: str = executor_option(),
    address: str = address_option(),
    build_cache: Path = build_cache_option(),
    max_builds: int = max_builds_option(),
    max_search_s: float = max_search_s_option(),
    strict_conditions: bool = typer.Option(
        False, "--strict-conditions", help="Exit 12 (after writing the bundle) when its "
        "figures are not comparable with the spec's [target]: a measurement ran busier than "
        "declared, or a conditional route shipped. Without it the release ends with a line "
        "that says so and exits 0."),
) -> None:
    """Tune a release spec and bundle the result, in one command.

    The target is checked first (it must not exist and the release version must be above any
    version of the same release in OUT), so a search is never run for a bundle that cannot be
    written. An interrupted release resumes its run folder when run again.
    """
    from dossier.backends import describe
    from dossier.bundle import check_target, write_bundle
    from dossier.lock import new_or_locked_run_folder
    from dossier.run_folder import CACHE_NAME, release_folder
    from dossier.spec_knobs import load_release_spec as load_spec
    from dossier.tuner import tune as run_tune
    from dossier_cli.progress import ProgressObserver

    s = load_spec(spec, {"max_builds": max_builds, "max_search_s": max_search_s})
    check_target(out_dir, s.release.name, s.release.version)
    folder = work or release_folder(out_dir, s.release.name, s.release.version)
    again = shlex.join(["dossier", "release", str(spec), "--out", str(out_dir),
                        *(["--work", str(work)] if work else [])])
    with new_or_locked_run_folder(folder):  # one release at a time, from search to bundle
        resume = (folder / CACHE_NAME).is_file()
        with on_interrupt(f"interrupted; finished trials are kept in {folder}: run {again} "
                          "again to resume"), ProgressObserver(verbose=not quiet) as obs:
            result = run_tune(s, folder, observer=obs, spec_path=spec, resume=resume,
                              build_jobs=build_jobs, executor=executor, address=address,
                              build_cache=build_cache)
        print_notes(result.notes)
        written = write_bundle(folder, out_dir, parent=parent, include_model=not no_model,
                               describe=describe)
    _report_written(written, as_json, strict_conditions)


# ------------------------------------------------------------------------------------- inspect
@app.command()
@handled
def inspect(
    path: Path = typer.Argument(..., metavar="BUNDLE", help="Bundle folder or .dossier.tar."),
    as_json: bool = typer.Option(False, "--json", help="Print the overview as JSON on stdout "
                                 "(the same as --format json)."),
    fmt: FormatName = format_option(Document.overview),
    output: Path = output_option(),
) -> None:
    """What a reviewer wants first: release, id, lineage, model, search, accuracy bar,
    baseline, shipped route with its speedup and interval (or why there is no gain), trial
    counts, warnings and the tuning host."""
    from dossier.bundle import open_bundle
    from dossier.bundle.overview import overview_of
    from dossier.bundle.reader import RECORDS_MAX_EXTRACT

    chosen = choose_format(fmt, as_json, Document.overview, "inspect", output)
    # the manifest, and the records (per-output losses, load hints): never an engine
    with open_bundle(path, lazy=True, max_extract=RECORDS_MAX_EXTRACT) as b:
        o = overview_of(b)
    for note in o.notes:
        err.print(f"[yellow]note:[/] {escape(note)}", soft_wrap=True)
    emit(chosen.overview(o), output)


# ---------------------------------------------------------------------------------------- pack
@app.command()
@handled
def pack(
    path: Path = typer.Argument(..., metavar="BUNDLE", help="Bundle folder (or .dossier.tar)."),
    out_dir: Path = typer.Option(..., "--out", "-o", metavar="DIR", help="Folder to write "
                                 "NAME-VERSION.dossier.tar into."),
) -> None:
    """Write a bundle as one file for transport: OUT/NAME-VERSION.dossier.tar.

    The archive is deterministic (the same bundle gives the same bytes). Every command that
    takes a bundle folder takes the .tar too, and extracts it safely."""
    from dossier.bundle import pack_bundle

    target = pack_bundle(path, out_dir)
    out.print(str(target), markup=False, soft_wrap=True)


# -------------------------------------------------------------------------------------- schema
@app.command()
@handled
def schema(
    out_dir: Path = typer.Option(None, "--out", "-o", metavar="DIR", help="Folder of the schema files "
                                 "(default: schemas; with --check, the installed copy)."),
    check: bool = typer.Option(False, "--check", help="Write nothing; exit 1 listing the files "
                               "that differ from what the models generate."),
) -> None:
    """Write JSON Schema files for the bundle manifest and every other file format dossier
    writes, generated from its models."""
    from dossier.schema import check_schemas, packaged_dir, write_schemas

    if out_dir is None:
        out_dir = packaged_dir() if check else Path("schemas")
    if check:
        drifted = check_schemas(out_dir)
        for name in drifted:
            err.print(f"drifted: {out_dir / name}", markup=False, soft_wrap=True)
        if drifted:
            err.print("regenerate with: dossier schema --out " + str(out_dir), markup=False)
            raise typer.Exit(int(ExitCode.DRIFT))
        err.print(f"OK: {out_dir} is up to date", markup=False, soft_wrap=True)
        return
    for p in write_schemas(out_dir):
        out.print(str(p), markup=False, soft_wrap=True)
