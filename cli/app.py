"""The typer app, error mapping and shared CLI helpers."""

from __future__ import annotations

import contextlib
import functools
import inspect
import time
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import typer
from typer.core import TyperArgument, TyperGroup, TyperOption

from dossier import __version__
from dossier.errors import DossierError, ExitCode, OutputError
from dossier_cli import logs
from dossier_cli.render import err, escape, line, out

F = TypeVar("F", bound=Callable[..., Any])

_EXIT_LABELS = {
    ExitCode.OK: "ok/VALID", ExitCode.DRIFT: "schema --check drift", ExitCode.USAGE: "usage",
    ExitCode.INPUT: "bad input",
    ExitCode.TUNE: "search failed", ExitCode.BACKEND_UNAVAILABLE: "backend not installed",
    ExitCode.BUNDLE: "bad bundle", ExitCode.OUTPUT: "output exists/unwritable",
    ExitCode.SUBOPTIMAL: "SUBOPTIMAL", ExitCode.INVALID: "INVALID",
    ExitCode.CONDITIONS: "not comparable with the target (--strict-conditions)",
    ExitCode.SIGNATURE: "signature", ExitCode.INTERNAL: "internal error",
    ExitCode.INTERRUPTED: "interrupted"}
"""Short labels for the root help; a code without one is named after its member."""


def _exit_codes() -> str:
    """Every exit code, from :class:`ExitCode` (so a new code is never missing)."""
    codes = {int(c): _EXIT_LABELS.get(c, c.name.lower().replace("_", " ")) for c in ExitCode}
    return ", ".join(f"{k} {v}" for k, v in sorted(codes.items()))


_METAVARS = {"path": "PATH", "str": "TEXT", "int": "N", "float": "NUMBER"}
"""An option's value in help, by its type, where the option names no metavar of its own
(typer would print ``<path>``, ``<int range>``, ``<list[Path]>``)."""
_CLICK_TYPES = {"integer": "int", "integer range": "int", "float range": "float", "text": "str"}
"""click's type names, for typer versions that have no ``display_type`` (older than 0.16)."""


class _Argument(TyperArgument):
    """An argument as click shows one: ``SPEC`` in the usage line (typer: ``{spec}``) and in the
    argument list (typer: ``spec <path>``)."""

    def _usage_display_name(self) -> str:
        name = self.display_name_raw if self.required else f"[{self.display_name_raw}]"
        return name + ("..." if self.nargs != 1 else "")

    def display_type_rich(self, ctx: Any) -> str | None:
        return None


def _plain_metavars(cmd: Any, ctx: Any) -> Any:
    """``cmd`` with every argument shown by its name in capitals and every option's value by
    its metavar, or else a word for its type (PATH, TEXT, N, NUMBER)."""
    for p in getattr(cmd, "params", ()):
        if isinstance(p, TyperArgument):
            p.metavar = p.metavar or p.name.upper()
            p.__class__ = _Argument
        elif isinstance(p, TyperOption) and p.metavar is None and not p.is_flag:
            shown = getattr(p, "display_type", None)  # typer's own words, where it has them
            label = shown(ctx) if shown is not None else _CLICK_TYPES.get(p.type.name, p.type.name)
            label = label.strip("<>").removesuffix(" range")
            label = label.removeprefix("list[").removesuffix("]").lower()
            p.metavar = _METAVARS.get(label, label.upper())
    return cmd


def _exit_status(exc: BaseException) -> int:
    """The exit status ``exc`` ends the command with: typer's and click's exits and usage
    errors carry theirs, SystemExit its code; an abort is 1, anything else a bug (70)."""
    status = getattr(exc, "exit_code", None)
    if isinstance(status, int):
        return status
    if isinstance(exc, SystemExit):
        return exc.code if isinstance(exc.code, int) else int(exc.code is not None)
    return 1 if type(exc).__name__ == "Abort" else int(ExitCode.INTERNAL)


class _Group(TyperGroup):
    """A command group whose list shows each command's whole first paragraph (click would cut
    it to one line, ending in "..."), and whose commands' help names values plainly."""

    def get_command(self, ctx: Any, cmd_name: str) -> Any:
        return _plain_metavars(super().get_command(ctx, cmd_name), ctx)

    def parse_args(self, ctx: Any, args: list[str]) -> list[str]:
        if ctx.parent is None:
            ctx.meta["dossier.args"] = list(args)
        rest: list[str] = super().parse_args(ctx, args)
        return rest

    def invoke(self, ctx: Any) -> Any:
        """The command, then (for the root, once it is done) the long commands' closing line
        with its exit status (:func:`dossier_cli.logs.close_command`), and the log handlers
        detached. The exit status is the command's, unchanged."""
        if ctx.parent is not None:
            return super().invoke(ctx)
        start, code, usage = time.perf_counter(), 0, False
        try:
            return super().invoke(ctx)
        except BaseException as exc:
            code = _exit_status(exc)
            usage = hasattr(exc, "show")  # a usage error, which click prints: nothing ran
            raise
        finally:
            args = ctx.meta.get("dossier.args", [])
            if not usage and not {"--help", "-h"} & set(args):
                logs.close_command(ctx.invoked_subcommand, args, code,
                                   time.perf_counter() - start)
            logs.reset()

    def format_commands(self, ctx: Any, formatter: Any) -> None:
        rows = []
        for name in self.list_commands(ctx):
            cmd = self.get_command(ctx, name)
            if cmd is not None and not cmd.hidden:
                text = cmd.short_help or inspect.cleandoc(cmd.help or "").split("\n\n", 1)[0]
                rows.append((name, " ".join(text.replace("\b", "").split())))
        if rows:
            with formatter.section("Commands"):
                formatter.write_dl(rows)


def group(**kwargs: Any) -> typer.Typer:
    """A typer app (the root or a command group) with plain help: click's formatting, which
    needs no rich (typer's rich help imports rich's Markdown and traceback renderers, about
    0.1 s on every --help); help texts are therefore plain text, not rich markup."""
    return typer.Typer(no_args_is_help=True, rich_markup_mode=None, cls=_Group, **kwargs)


app = group(
    name="dossier", add_completion=False,
    help="Tune compiled inference engines, bundle them with their evidence, verify them on "
         f"target hosts, and explain why a build route was chosen.\n\nExit codes: "
         f"{_exit_codes()}.")


def fail(exc: DossierError) -> None:
    """Print one line for a DossierError and exit with its code."""
    err.print(f"[bold red]error:[/] {escape(exc.diagnostics())}", soft_wrap=True)
    raise typer.Exit(int(exc.exit_code))


def handled(fn: F) -> F:
    """Map DossierError to one line and its exit code; anything else is a bug (exit 70)."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except DossierError as exc:
            fail(exc)
        except KeyboardInterrupt:  # a command that can say how to resume uses on_interrupt
            line("interrupted")
            raise typer.Exit(int(ExitCode.INTERRUPTED)) from None
        except (typer.Exit, typer.Abort, typer.TyperException):  # usage errors: exit 2
            raise
        except Exception:  # noqa: BLE001 - last resort: a bug in dossier
            err.print("[bold red]internal error[/] (a bug in dossier; please report it):")
            err.print(escape(traceback.format_exc()), markup=False)
            raise typer.Exit(int(ExitCode.INTERNAL)) from None

    return wrapper  # type: ignore[return-value]


@contextlib.contextmanager
def on_interrupt(message: str) -> Iterator[None]:
    """Ctrl-C inside the block prints ``message`` (one line, on stderr: what was kept and how
    to go on) and exits 130."""
    try:
        yield
    except KeyboardInterrupt:
        line(message)
        raise typer.Exit(int(ExitCode.INTERRUPTED)) from None


def version_callback(value: bool) -> None:
    if value:
        out.print(f"dossier {__version__}")
        raise typer.Exit()


@app.callback()
def _root(version: bool = typer.Option(False, "--version", callback=version_callback,
                                       is_eager=True, help="Print the version and exit."),
          verbose: int = typer.Option(0, "--verbose", "-v", count=True, show_default=False,
                                      help="Log more on stderr: -v what the command does "
                                           "(trials, builds, cache hits, verify steps), -vv "
                                           "debugging detail. Default: warnings only."),
          log_file: Path = typer.Option(None, "--log-file", metavar="FILE",
                                        help="Also append every log record, debugging detail "
                                             "included, to FILE.")) -> None:
    """dossier: tune, bundle, verify and explain compiled inference engines."""
    try:
        logs.configure(verbose, log_file)
    except OSError as exc:
        fail(OutputError(f"cannot write the log file {log_file}: {exc.strerror or exc}"))
