"""``dossier release``, ``bundle``, ``inspect``, ``verify``, ``pack`` and ``schema``."""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Any

import typer

from dossier_cli.app import app, handled, on_interrupt
from dossier_cli.cmd_tune import address_option, build_cache_option, executor_option, print_notes
from dossier_cli.render import err, escape, out, print_json


def _report_written(written: Any, as_json: bool) -> None:
    m = written.manifest
    for w in m.warnings:
        err.print(f"[yellow]warning:[/] {escape(w)}", soft_wrap=True)
    if as_json:
        print_json({"bundle": str(written.path), "dossier_id": m.dossier_id,
                    "release": m.release, "version": m.release_version, "parent": m.parent,
                    "result": m.summary.result, "warnings": list(m.warnings)})
        return
    err.print(f"bundled {escape(m.name)}: id {m.dossier_id}, {len(m.files)} files + manifest; "
              f"{escape(m.summary.result)}", soft_wrap=True)
    out.print(str(written.path), markup=False, soft_wrap=True)


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
    from dossier.bundle import write_bundle

    written = write_bundle(source, out_dir, parent=parent, include_model=not no_model)
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
) -> None:
    """Tune a release spec and bundle the result, in one command.

    The target is checked first (it must not exist and the release version must be above any
    version of the same release in OUT), so a search is never run for a bundle that cannot be
    written. An interrupted release resumes its run folder when run again.
    """
    from dossier.bundle import check_target, write_bundle
    from dossier.lock import new_or_locked_run_folder
    from dossier.spec import load_spec
    from dossier.tuner import CACHE_NAME
    from dossier.tuner import tune as run_tune
    from dossier_cli.progress import ProgressObserver

    s = load_spec(spec)
    check_target(out_dir, s.release.name, s.release.version)
    folder = work or out_dir / ".runs" / f"{s.release.name}-{s.release.version}"
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
        written = write_bundle(folder, out_dir, parent=parent, include_model=not no_model)
    _report_written(written, as_json)


# ------------------------------------------------------------------------------------- inspect
@app.command()
@handled
def inspect(
    path: Path = typer.Argument(..., metavar="BUNDLE", help="Bundle folder or .dossier.tar."),
    as_json: bool = typer.Option(False, "--json", help="Print the overview as JSON on stdout."),
) -> None:
    """What a reviewer wants first: release, id, lineage, model, search, accuracy bar,
    baseline, shipped route with its speedup and interval (or why there is no gain), trial
    counts, warnings and the tuning host."""
    from dossier.bundle import open_bundle
    from dossier.bundle.reader import RECORDS_MAX_EXTRACT

    # the manifest, and the records (per-output losses, load hints): never an engine
    with open_bundle(path, lazy=True, max_extract=RECORDS_MAX_EXTRACT) as b:
        o = b.overview()
    for note in o["notes"]:
        err.print(f"[yellow]note:[/] {escape(note)}", soft_wrap=True)
    if as_json:
        print_json(o)
        return
    for line in overview_lines(o):
        out.print(line, markup=False, soft_wrap=True)


def overview_lines(o: dict[str, Any]) -> list[str]:
    """The overview as text lines."""
    m, b = o["model"], o["baseline"]
    lines = [
        f"{o['release']} version {o['version']}" + (f": {o['description']}" if o["description"] else ""),
        f"  dossier id   {o['dossier_id']}",
        f"  parent       {o['parent'] or 'none'}",
        f"  created      {o['created_at']} (dossier {o['tool_version']}, format {o['format_version']})",
        f"  backend      {o['backend']}"
        + (f" {o['engine_version']} (the plan's TensorRT; tuner {o['tuner_version']})"
           if o.get("engine_version") else f" ({o['tuner_version']})"),
        f"  model        {m['file_name']}, {m['size']} bytes, {m['algorithm']} {m['digest']}"
        + (f", {m['external_data']} external data file(s)" if m["external_data"] else "")
        + ("" if m["included"] else " (not included)"),
        f"  search       {o['strategy']} over {o['selection']}",
        f"  accuracy     {o['metric']} < {o['threshold']:g} on every output of "
        f"{o['validation_pairs']} pair(s)"
        + (f" (atol {o['atol']:g}, rtol {o['rtol']:g})" if o["metric"] == "l0" else ""),
        f"  baseline     {b['route'] or '(default route)'}"
        + (f"  baseline (trial {b['trial_index']}) {b['median_ms']:.3f} ms [{b['ci_low_ms']:.3f}, "
           f"{b['ci_high_ms']:.3f}] (n={b['n']})" if b["median_ms"] is not None else ""),
        f"  shipped      {o['winner']['route'] or '(default route)'}"
        + ("  (the baseline)" if o["winner"]["is_baseline"] else ""),
    ]
    sp = o["speedup"]
    if sp:
        lines.append(f"  speedup      {sp['value']:.3f}x [{sp['ci_low']:.3f}, {sp['ci_high']:.3f}] "
                     f"({sp['confidence']:.0%} CI), p={sp['p_value']:.2g}")
    else:  # "no significant gain", or "not statistically checked" (a trtexec import)
        lines.append(f"  speedup      {o['result']}")
    lines.append(f"  why          {o['reason']}")
    for key, label in (("aa", "A/A check   "), ("confirm_aa", "A/A confirm ")):
        a = o.get(key)
        if a:
            lines.append(f"  {label} {a['speedup']:.3f}x [{a['speedup_ci_low']:.3f}, "
                         f"{a['speedup_ci_high']:.3f}] (p={a['p_value']:.2g}, "
                         + (f"{a['processes']} processes" if a.get("processes")
                            else f"{a['rounds'] or '?'} rounds") + f", {a['procedure']}): "
                         + ("two loads of one engine read apart" if a["significant"]
                            else "no difference, as it should"))
    lines.append(f"  load with    dossier.load({o['bundle']!r}) (verifies, then loads "
                 "the engine as it was timed; dossier run BUNDLE -i inputs.npz tries it)")
    if o.get("load"):
        ld = o["load"]
        lines.append(f"  raw loader   {ld['call'].replace('ENGINE', repr(o['winner']['engine']))}"
                     + (f" ({', '.join(f'{k}={v}' for k, v in ld['options'].items())})"
                        if ld["options"] else "") + " (no verification)")
    if o["runner_up"]:
        ru = o["runner_up"]
        lines.append(f"  runner-up    {ru['route']}"
                     + (f"  {ru['speedup']:.3f}x" if ru["speedup"] is not None else ""))
    for i, x in enumerate(o.get("accuracy_by_output") or []):
        loss = "NaN/Inf" if x["loss"] is None else f"{x['loss']:.3g}"
        lines.append(("  losses       " if i == 0 else " " * 15)
                     + f"{x['output']}: {o['metric']} {loss} (worst pair {x['pair']})")
    counts = ", ".join(f"{k} {v}" for k, v in sorted(o["trials"].items()))
    cost = ("search unknown (the search record has no wall or build times)"
            if o["search_wall_s"] is None else
            f"search {o['search_wall_s']:.1f} s, builds {o['build_s_total']:.1f} s")
    lines.append(f"  trials       {counts} (+{o['confirm_trials']} confirmation); {cost}")
    host = o["tuning_host"]
    lines.append("  tuning host  " + (", ".join(f"{k} {v}" for k, v in sorted(host.items()))
                                      or "unknown"))
    for w in o["warnings"]:
        lines.append(f"  warning      {w}")
    return lines


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
            raise typer.Exit(1)
        err.print(f"OK: {out_dir} is up to date", markup=False, soft_wrap=True)
        return
    for p in write_schemas(out_dir):
        out.print(str(p), markup=False, soft_wrap=True)
