"""``dossier knobs`` and ``dossier tune``."""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Any

import typer

from dossier_cli.app import app, handled, on_interrupt
from dossier_cli.render import err, escape, fmt_speedup, out, print_json


# --------------------------------------------------------------------------------------- knobs
@app.command(context_settings={"ignore_unknown_options": True})
@handled
def knobs(
    knob: str = typer.Argument(None, help="Show only this knob, as the table names it "
                               "(-optimizer:NchwcTransformer) or without the dash."),
    backend: str = typer.Option("onnxruntime", "--backend",  # no -b: "-builderX" is a knob
                                help="Backend whose knob database to show."),
    as_json: bool = typer.Option(False, "--json", help="Print the database as JSON."),
) -> None:
    """List the knob database of a backend: every knob, its allowed values, default and help.

    Knobs go into a selection in trtexec syntax: -knob=[a|b] varies a knob,
    -knob=v pins it. [numerics]: the knob changes the outputs; [contention]: its effect
    depends on what else runs on the host (threads, spinning, execution mode).
    """
    from rich.table import Table

    from dossier.backends import get_backend

    b = get_backend(backend)
    b.require()
    db = b.knob_database()
    items = [db.get(knob)] if knob else list(db.knobs)
    if as_json:
        print_json({"backend": db.backend, "tuner_version": db.tuner_version,
                    "digest": db.digest(),
                    "knobs": [k.model_dump(mode="json") for k in items],
                    "not_offered": b.knobs_not_offered(),
                    "contention_knobs": sorted(b.contention_knobs)})
        return
    table = Table(title=f"{db.backend} knobs ({db.tuner_version}, {len(db.knobs)} knobs)")
    for col in ("knob", "allowed values", "default", "phase", "help"):
        table.add_column(col, overflow="fold")  # a narrow terminal wraps names, never cuts them
    for k in items:
        table.add_row(escape("-" + k.name), escape(k.allowed_text().split("=", 1)[1]), k.default,
                      k.phase.value, escape(k.help + (" [numerics]" if k.changes_numerics else "")
                                            + (" [contention]" if k.name in b.contention_knobs
                                               else "")))
    out.print(table)
    for why in b.knobs_not_offered().values():
        out.print(f"not offered on this host: {escape(why)}")


# ---------------------------------------------------------------------------------------- tune
def _forecast(spec: Any, build_cache: Path | None, as_json: bool) -> None:
    """``--dry-run`` of a budgeted search: what its budget buys."""
    import dataclasses

    from dossier.strategies.forecast import forecast
    from dossier.tuner import prepare

    p = prepare(spec)
    f = forecast(p.spec, p.strategy, p.selection, p.db, p.backend, p.model, build_cache)
    if as_json:
        print_json({**dataclasses.asdict(f), "builds_s": f.builds_s})
        return
    for line in f.lines():
        out.print(line, markup=False, soft_wrap=True)


def _overrides(selection: str | None, strategy: str | None, threshold: float | None,
               metric: str | None, backend: str | None = None, max_builds: int | None = None,
               max_search_s: float | None = None) -> dict[str, Any]:
    return {"selection": selection, "strategy": strategy, "threshold": threshold,
            "metric": metric, "backend": backend, "max_builds": max_builds,
            "max_search_s": max_search_s}


def max_builds_option() -> int | None:
    """The ``--max-builds`` option."""
    option: int | None = typer.Option(None, "--max-builds", metavar="N", min=1, help="Strategies random "
                                      "and budget: routes measured at most, the baseline "
                                      "included (overrides tune.max_builds).")
    return option


def max_search_s_option() -> float | None:
    """The ``--max-search-s`` option."""
    option: float | None = typer.Option(None, "--max-search-s", metavar="S", help="Strategies "
                                        "random and budget: seconds of trials at most "
                                        "(overrides tune.max_search_s).")
    return option


EXECUTOR_HELP = ("Where builds and measurements run: local (this host) or ray (a Ray cluster: "
                 "builds on CPU workers, each trial timed against the baseline on one GPU).")
ADDRESS_HELP = ("Ray cluster to join with --executor ray (e.g. HOST:6379, or auto); default: a "
                "new local Ray instance.")


def executor_option() -> str:
    """The ``--executor`` option."""
    option: str = typer.Option("local", "--executor", help=EXECUTOR_HELP)
    return option


BUILD_CACHE_HELP = ("Folder of engines kept across searches: a build whose inputs (model, "
                    "compiler versions, host, build-time knobs) match a stored one is copied "
                    "instead of rebuilt, then judged and timed as usual. Must belong to you "
                    "and be writable by no one else. Default: $DOSSIER_BUILD_CACHE, else none.")


def build_cache_option() -> Path | None:
    """The ``--build-cache`` option."""
    option: Path | None = typer.Option(None, "--build-cache", envvar="DOSSIER_BUILD_CACHE", metavar="DIR",
                                       help=BUILD_CACHE_HELP, show_envvar=False)
    return option


def address_option() -> str:
    """The ``--address`` option."""
    option: str = typer.Option(None, "--address", help=ADDRESS_HELP)
    return option


def print_notes(notes: list[str]) -> None:
    """What the executor had to say (refused workers, re-queued trials), on stderr."""
    for note in notes:
        err.print(f"[yellow]note:[/] {escape(note)}", soft_wrap=True)


def default_out(name: str, version: int) -> Path:
    """Where a run goes when --out is not given."""
    return Path("dossier-runs") / f"{name}-{version}"


def _resumable(folder: Path) -> Any:
    """What Ctrl-C during a search says: where its trials are and the command that resumes it."""
    again = shlex.join(["dossier", "tune", "--continue", str(folder)])
    return on_interrupt(f"interrupted; finished trials are kept in {folder}: resume with {again}")


@app.command()
@handled
def tune(
    spec: Path = typer.Argument(None, metavar="SPEC", help="Release spec (release.toml). Optional with --continue."),
    selection: str = typer.Option(None, help="Override the spec's selection, trtexec syntax: "
                                  "'-a=[x|y] -b=z'."),
    strategy: str = typer.Option(None, help="Override the strategy: fast, mixed, full, random or "
                                 "budget."),
    threshold: float = typer.Option(None, help="Override the accuracy threshold (> 0)."),
    metric: str = typer.Option(None, help="Override the metric: l0, l1, l2, linf or cos."),
    out_dir: Path = typer.Option(None, "--out", "-o", metavar="RUN", help="Run folder (default: "
                                 "dossier-runs/NAME-VERSION). Must not hold a search yet."),
    dry_run: bool = typer.Option(False, "--dry-run", help="List the routes in order; build "
                                 "nothing. Refused for mixed (its phase 2 depends on results). "
                                 "For random and budget: what the budget buys (builds, and "
                                 "their time from the build cache or one build of the "
                                 "baseline)."),
    resume: Path = typer.Option(None, "--continue", metavar="RUN", help="Resume the search of this tuning "
                                "cache (or run folder). Finished trials are never re-run."),
    as_json: bool = typer.Option(False, "--json", help="Print the result as JSON on stdout."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="No per-trial lines on stderr."),
    build_jobs: int = typer.Option(None, "--build-jobs", "-j", min=1, help="Builds that run at "
                                   "once, ahead of measurement (default: from the cores and "
                                   "what one build of the backend uses). Trials are still "
                                   "measured one at a time, with every build paused."),
    executor: str = executor_option(),
    address: str = address_option(),
    build_cache: Path = build_cache_option(),
    max_builds: int = max_builds_option(),
    max_search_s: float = max_search_s_option(),
) -> None:
    """Search build routes, drop those that fail or break accuracy, keep the fastest admissible
    one if it beats the baseline significantly.

    Each trial runs in its own process with a timeout; every finished trial is appended to
    RUN/tuning-cache.jsonl at once, so a killed search resumes with --continue.
    """
    from dossier.spec_knobs import load_release_spec as load_spec
    from dossier.tuner import continue_tune, plan
    from dossier.tuner import tune as run_tune
    from dossier_cli.progress import ProgressObserver

    overrides = _overrides(selection, strategy, threshold, metric, max_builds=max_builds,
                           max_search_s=max_search_s)
    if resume is not None:
        if spec is not None:
            s = load_spec(spec, overrides)
            folder = resume if resume.is_dir() else resume.parent
            with _resumable(folder), ProgressObserver(verbose=not quiet) as obs:
                result = run_tune(s, folder, observer=obs, spec_path=spec, resume=True,
                                  build_jobs=build_jobs, executor=executor, address=address,
                                  build_cache=build_cache)
        else:
            if any(v is not None for v in overrides.values()):
                raise typer.BadParameter("--continue without SPEC takes no overrides: the "
                                         "search continues as it was started")
            folder = resume if resume.is_dir() else resume.parent
            with _resumable(folder), ProgressObserver(verbose=not quiet) as obs:
                result = continue_tune(resume, observer=obs, build_jobs=build_jobs,
                                       executor=executor, address=address,
                                       build_cache=build_cache)
    else:
        if spec is None:
            raise typer.BadParameter("give a release spec, or --continue CACHE")
        s = load_spec(spec, overrides)
        if dry_run and s.tune.strategy in ("random", "budget"):
            _forecast(s, build_cache, as_json)
            return
        if dry_run:
            baseline, routes = plan(s)
            if as_json:
                print_json({"strategy": s.tune.strategy, "selection": s.tune.selection,
                            "baseline": baseline.text(), "count": len(routes),
                            "routes": [r.text() for r in routes]})
            else:
                for i, r in enumerate(routes):
                    out.print(f"[{i}]:{r.text()}", markup=False)
                err.print(f"{len(routes)} routes ({s.tune.strategy}); baseline: {baseline}")
            return
        folder = out_dir or default_out(s.release.name, s.release.version)
        with _resumable(folder), ProgressObserver(verbose=not quiet) as obs:
            result = run_tune(s, folder, observer=obs, spec_path=spec, build_jobs=build_jobs,
                              executor=executor, address=address, build_cache=build_cache)
    from dossier.datasets import decision_result

    print_notes(result.notes)
    d = result.decision
    if as_json:
        print_json({"run": str(result.run_dir), "cache": str(result.cache.path),
                    "trials": len(result.cache.trials), "trials_run": result.trials_run,
                    "decision": d.model_dump(mode="json")})
        return
    counts: dict[str, int] = {}
    for t in result.cache.trials:
        if t.role != "confirm":
            counts[t.outcome.value] = counts.get(t.outcome.value, 0) + 1
    err.print(f"trials: {', '.join(f'{k} {v}' for k, v in sorted(counts.items()))}")
    out.print(f"run: {result.run_dir}", markup=False)
    out.print(f"shipped route: {d.shipped_route or '(default route)'}", markup=False)
    out.print(f"speedup: {fmt_speedup(d.speedup, d.speedup_ci_low, d.speedup_ci_high)}"
              if d.gain else f"speedup: {decision_result(d)}", markup=False)
    out.print(d.reason, markup=False)
