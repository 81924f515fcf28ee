"""The ``dossier`` command: parse, call :mod:`dossier`, render, map errors to exit codes."""

from __future__ import annotations

import functools
import sys
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import typer
from rich.markup import escape
from rich.table import Table

from cli.render import ProgressObserver, err, fmt_speedup, out, print_json
from dossier import __version__
from dossier.errors import DossierError, ExitCode

F = TypeVar("F", bound=Callable[..., Any])

app = typer.Typer(
    name="dossier", no_args_is_help=True, add_completion=False, rich_markup_mode="rich",
    help="Tune compiled inference engines, bundle them with their evidence, verify them on "
         "target hosts, and explain why a build route was chosen.\n\n"
         "Exit codes: 0 ok/VALID, 2 usage, 3 bad input, 4 search failed, 5 backend not "
         "installed, 6 bad bundle, 7 output exists/unwritable, 10 SUBOPTIMAL, 11 INVALID, "
         "13 signature, 70 internal error, 130 interrupted.")


def fail(exc: DossierError) -> None:
    """Print one line for a DossierError and exit with its code."""
    err.print(f"[bold red]error:[/] {escape(exc.diagnostics())}")
    raise typer.Exit(int(exc.exit_code))


def handled(fn: F) -> F:
    """Map DossierError to one line and its exit code; anything else is a bug (exit 70)."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except DossierError as exc:
            fail(exc)
        except KeyboardInterrupt:
            err.print("interrupted; finished trials are kept in the tuning cache "
                      "(resume with dossier tune --continue)")
            raise typer.Exit(int(ExitCode.INTERRUPTED)) from None
        except (typer.Exit, typer.Abort):
            raise
        except Exception:  # noqa: BLE001 - last resort: a bug in dossier
            err.print("[bold red]internal error[/] (a bug in dossier; please report it):")
            err.print(escape(traceback.format_exc()), markup=False)
            raise typer.Exit(int(ExitCode.INTERNAL)) from None

    return wrapper  # type: ignore[return-value]


def version_callback(value: bool) -> None:
    if value:
        out.print(f"dossier {__version__}")
        raise typer.Exit()


@app.callback()
def _root(version: bool = typer.Option(False, "--version", callback=version_callback,
                                       is_eager=True, help="Print the version and exit.")) -> None:
    """dossier: tune, bundle, verify and explain compiled inference engines."""


# --------------------------------------------------------------------------------------- knobs
@app.command()
@handled
def knobs(
    knob: str = typer.Argument(None, help="Show only this knob (leading '-' optional)."),
    backend: str = typer.Option("onnxruntime", "--backend", "-b",
                                help="Backend whose knob database to show."),
    as_json: bool = typer.Option(False, "--json", help="Print the database as JSON."),
) -> None:
    """List the knob database of a backend: every knob, its allowed values, default and help.

    Knobs go into a selection in trtexec syntax: [bold]-knob=[a|b][/] varies a knob,
    [bold]-knob=v[/] pins it.
    """
    from dossier.backends import get_backend

    b = get_backend(backend)
    b.require()
    db = b.knob_database()
    items = [db.get(knob)] if knob else list(db.knobs)
    if as_json:
        print_json({"backend": db.backend, "tuner_version": db.tuner_version,
                    "digest": db.digest(),
                    "knobs": [k.model_dump(mode="json") for k in items]})
        return
    table = Table(title=f"{db.backend} knobs ({db.tuner_version}, {len(db.knobs)} knobs)")
    for col in ("knob", "allowed values", "default", "phase", "help"):
        table.add_column(col)
    for k in items:
        table.add_row(escape("-" + k.name), escape(k.allowed_text().split("=", 1)[1]), k.default,
                      k.phase.value, escape(k.help + (" [numerics]" if k.changes_numerics else "")))
    out.print(table)


# ---------------------------------------------------------------------------------------- tune
def _overrides(selection: str | None, strategy: str | None, threshold: float | None,
               metric: str | None, backend: str | None = None) -> dict[str, Any]:
    return {"selection": selection, "strategy": strategy, "threshold": threshold,
            "metric": metric, "backend": backend}


def default_out(name: str, version: int) -> Path:
    """Where a run goes when --out is not given."""
    return Path("dossier-runs") / f"{name}-{version}"


@app.command()
@handled
def tune(
    spec: Path = typer.Argument(None, help="Release spec (release.toml). Optional with --continue."),
    selection: str = typer.Option(None, help="Override the spec's selection, trtexec syntax: "
                                  "'-a=[x|y] -b=z'."),
    strategy: str = typer.Option(None, help="Override the strategy: fast, mixed or full."),
    threshold: float = typer.Option(None, help="Override the accuracy threshold (> 0)."),
    metric: str = typer.Option(None, help="Override the metric: l0, l1, l2, linf or cos."),
    out_dir: Path = typer.Option(None, "--out", "-o", help="Run folder (default: "
                                 "dossier-runs/NAME-VERSION). Must not hold a search yet."),
    dry_run: bool = typer.Option(False, "--dry-run", help="List the routes in order; build "
                                 "nothing. Refused for mixed (its phase 2 depends on results)."),
    resume: Path = typer.Option(None, "--continue", help="Resume the search of this tuning "
                                "cache (or run folder). Finished trials are never re-run."),
    as_json: bool = typer.Option(False, "--json", help="Print the result as JSON on stdout."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="No per-trial lines on stderr."),
) -> None:
    """Search build routes, drop those that fail or break accuracy, keep the fastest admissible
    one if it beats the baseline significantly.

    Each trial runs in its own process with a timeout; every finished trial is appended to
    [bold]RUN/tuning-cache.jsonl[/] at once, so a killed search resumes with [bold]--continue[/].
    """
    from dossier.spec import load_spec
    from dossier.tuner import continue_tune, plan, tune as run_tune

    overrides = _overrides(selection, strategy, threshold, metric)
    if resume is not None:
        if spec is not None:
            s = load_spec(spec, overrides)
            folder = resume if resume.is_dir() else resume.parent
            with ProgressObserver(verbose=not quiet) as obs:
                result = run_tune(s, folder, observer=obs, spec_path=spec, resume=True)
        else:
            if any(v is not None for v in overrides.values()):
                raise typer.BadParameter("--continue without SPEC takes no overrides: the "
                                         "search continues as it was started")
            with ProgressObserver(verbose=not quiet) as obs:
                result = continue_tune(resume, observer=obs)
    else:
        if spec is None:
            raise typer.BadParameter("give a release spec, or --continue CACHE")
        s = load_spec(spec, overrides)
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
        with ProgressObserver(verbose=not quiet) as obs:
            result = run_tune(s, folder, observer=obs, spec_path=spec)
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
              if d.gain else "speedup: no significant gain", markup=False)
    out.print(d.reason, markup=False)


def main() -> None:
    """Console-script entry point."""
    try:
        import cli.commands  # noqa: F401 - registers the remaining commands
    except ModuleNotFoundError as exc:
        if exc.name != "cli.commands":
            raise
    app(prog_name="dossier")


if __name__ == "__main__":
    sys.exit(main())
