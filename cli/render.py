"""Rendering for the CLI: status and progress go to stderr, reports to stdout.

Imported by every command module when the CLI starts, so it imports neither rich nor more of
the library than :mod:`dossier.formats` (whose formats are imported when chosen):
the consoles :data:`err` and :data:`out` are made (and rich imported) the first time a command
prints through them; :func:`line` writes a plain line without rich. The search's progress display
is :mod:`dossier_cli.progress`, imported by the commands that search.
"""

from __future__ import annotations

import functools
import json
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dossier.formats import Document, FormatName, format_class
from dossier.formats.escaping import printable
from dossier.formats.text import UNWRAPPED
from dossier.measure.figure import speedup_text

if TYPE_CHECKING:
    from rich.console import Console

    from dossier.formats import Format


@functools.cache
def console(stderr: bool) -> Console:
    """The rich console for stderr or stdout, made on first use. Lines are never hard-wrapped:
    in a terminal they wrap as the terminal wraps them; elsewhere (a pipe, a file, CI) a line is
    one line and tables are not truncated."""
    from rich.console import Console

    class Escaping(Console):
        """A console whose text arguments pass through :func:`printable`."""

        def print(self, *objects: Any, **kw: Any) -> None:
            super().print(*(printable(o) if isinstance(o, str) else o for o in objects), **kw)

    made = Escaping(stderr=stderr, highlight=False, soft_wrap=True)
    if not made.is_terminal and "COLUMNS" not in os.environ:
        made = Escaping(stderr=stderr, highlight=False, soft_wrap=True, width=UNWRAPPED)
    return made


class _Deferred:
    """Stands for :func:`console` until a command first prints (rich is imported then)."""

    def __init__(self, stderr: bool) -> None:
        self._stderr = stderr

    def __getattr__(self, name: str) -> Any:
        return getattr(console(self._stderr), name)


err: Any = _Deferred(stderr=True)
out: Any = _Deferred(stderr=False)


def escape(text: str) -> str:
    """``text`` with rich markup and control characters escaped (for an f-string or a table
    cell printed through :data:`err`/:data:`out`)."""
    from rich.markup import escape as rich_escape

    return rich_escape(printable(text))


def line(text: str, stderr: bool = True) -> None:
    """One plain line (no markup, never wrapped) on stderr or stdout, without importing rich."""
    stream = sys.stderr if stderr else sys.stdout
    stream.write(printable(text) + "\n")
    stream.flush()


def print_json(data: Any) -> None:
    """Machine-readable output on stdout."""
    sys.stdout.write(json.dumps(data, indent=2, sort_keys=False, default=str) + "\n")


def fmt_speedup(speedup: float | None, lo: float | None, hi: float | None) -> str:
    """``1.234x [1.200, 1.270]`` or ``-``."""
    if speedup is None:
        return "-"
    return speedup_text(speedup, lo if lo is not None else float("nan"),
                        hi if hi is not None else float("nan"))


def row_label(r: Any) -> str:
    """What a trial's reading shows, as the judge recorded it (``Comparison.faster`` and
    ``slower``, set by :func:`dossier.measure.timing.compare` and :func:`dossier.measure.timing.process_compare`
    with the rule of :meth:`dossier.measure.reading.Comparison.verdict`): a screening trial is only ever *screened*
    faster or slower (the confirmation decides); a confirmation row is confirmed or not."""
    c = r.comparison
    label = "faster" if c.faster else "slower" if c.slower else "no significant effect"
    if r.role == "baseline" or (r.role == "confirm" and c.against != "aa"):
        return f"A/A: {label}"
    if r.role == "confirm":
        n = f" ({c.processes} processes)" if c.processes else ""
        why = {"futile": ", futile", "outranked": ", outranked"}.get(
            getattr(r, "extra", {}).get("confirmation", ""), "")
        return ("confirmed" if label == "faster" else f"not confirmed{why}") + n
    raced = getattr(r, "raced", None)
    if raced:  # racing: too few rounds for the test to say anything
        from dossier.trial import stopped_ahead  # loaded by then: the rows are trial records

        return f"{'ahead' if stopped_ahead(raced) else 'raced out'} after {c.rounds} rounds"
    return {"faster": "screened faster", "slower": "screened slower"}.get(label, label)


# ------------------------------------------------------------------------------ output formats
def format_option(document: Document) -> Any:
    """``--format``: the output format of a report (see :mod:`dossier.formats`)."""
    import typer

    html = ("html: the self-contained HTML report with plots (needs the report extra)"
            if document is Document.explanation else "html: explain only")
    return typer.Option(None, "--format", metavar="FORMAT", case_sensitive=False,
                        help="text (default), json (the same as --json), markdown (GitHub-"
                        f"flavoured, for a CI job summary), or {html}.")


def output_option() -> Any:
    """``--output FILE``: the report into a file instead of stdout."""
    import typer

    return typer.Option(None, "--output", metavar="FILE", help="Write the report (in --format) "
                        "to this file instead of stdout, replaced atomically if it exists.")


def choose_format(name: FormatName | None, as_json: bool, document: Document, command: str,
                  output: Path | None, *, styled: bool = True) -> Format:
    """The format of ``--format`` (``--json`` is ``--format json``; default text), refused with
    one line and exit 2 where the command has no such format. Text is coloured and tables fold
    to the terminal's width only when it goes to a terminal (and ``styled``: False where the
    command prints no text report, so that rich is not loaded to ask)."""
    from dossier.errors import ExitCode

    if as_json and name not in (None, FormatName.json):
        _usage(f"--json is --format json: give --json or --format {name.value}, not both",
               ExitCode.USAGE)
    chosen = FormatName.json if as_json else name or FormatName.text
    cls = format_class(chosen)
    if document not in cls.documents:
        _usage(f"--format {chosen.value}: {command} has no {chosen.value} output (explain has "
               "the HTML report)", ExitCode.USAGE)
    if (chosen is FormatName.text and output is None and styled
            and (sys.stdout.isatty() or os.environ.get("FORCE_COLOR"))):  # rich only then
        terminal = console(stderr=False)
        if terminal.is_terminal:
            return cls(color=True, width=terminal.width)
    return cls()


def _usage(message: str, code: int) -> None:
    import typer

    line(f"error: {message}")
    raise typer.Exit(int(code))


def emit(text: str, output: Path | None) -> None:
    """A rendered report on stdout, or into ``output`` (atomically; ``wrote FILE`` on stderr)."""
    if output is None:
        sys.stdout.write(text)
        sys.stdout.flush()
        return
    from dossier.formats.output import write_output

    write_output(output, text)
    line(f"wrote {output}")
