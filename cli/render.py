"""Rendering for the CLI: status and progress go to stderr, reports to stdout.

Imported by every command module when the CLI starts, so it imports neither the library nor rich:
the consoles :data:`err` and :data:`out` are made (and rich imported) the first time a command
prints through them; :func:`line` writes a plain line without rich. The search's progress display
is :mod:`dossier_cli.progress`, imported by the commands that search.
"""

from __future__ import annotations

import functools
import json
import os
import sys
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rich.console import Console

UNWRAPPED = 10_000
"""Console width outside a terminal: wide enough that nothing is wrapped or cut."""


@functools.cache
def console(stderr: bool) -> Console:
    """The rich console for stderr or stdout, made on first use. Lines are never hard-wrapped:
    in a terminal they wrap as the terminal wraps them; elsewhere (a pipe, a file, CI) a line is
    one line and tables are not truncated."""
    from rich.console import Console

    made = Console(stderr=stderr, highlight=False, soft_wrap=True)
    if not made.is_terminal and "COLUMNS" not in os.environ:
        made = Console(stderr=stderr, highlight=False, soft_wrap=True, width=UNWRAPPED)
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
    """``text`` with rich markup escaped (for an f-string printed through :data:`err`/:data:`out`)."""
    from rich.markup import escape as rich_escape

    return rich_escape(text)


def line(text: str, stderr: bool = True) -> None:
    """One plain line (no markup, never wrapped) on stderr or stdout, without importing rich."""
    stream = sys.stderr if stderr else sys.stdout
    stream.write(text + "\n")
    stream.flush()


def print_json(data: Any) -> None:
    """Machine-readable output on stdout."""
    sys.stdout.write(json.dumps(data, indent=2, sort_keys=False, default=str) + "\n")


def fmt_speedup(speedup: float | None, lo: float | None, hi: float | None) -> str:
    """``1.234x [1.200, 1.270]`` or ``-``."""
    if speedup is None:
        return "-"
    return f"{speedup:.3f}x [{lo:.3f}, {hi:.3f}]"


def row_label(r: Any) -> str:
    """What a trial's reading shows, as the judge recorded it (``Comparison.faster`` and
    ``slower``, set by :func:`dossier.timing.compare` and :func:`dossier.timing.process_compare`
    with the rule of :func:`dossier.verdict.judge`): a screening trial is only ever *screened*
    faster or slower (the confirmation decides); a confirmation row is confirmed or not."""
    c = r.comparison
    label = "faster" if c.faster else "slower" if c.slower else "no significant effect"
    if r.role == "baseline" or (r.role == "confirm" and c.against != "aa"):
        return f"A/A: {label}"
    if r.role == "confirm":
        n = f" ({c.processes} processes)" if c.processes else ""
        return ("confirmed" if label == "faster" else "not confirmed") + n
    return {"faster": "screened faster", "slower": "screened slower"}.get(label, label)
