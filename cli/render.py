"""Rendering for the CLI: status and progress go to stderr, reports to stdout.

Imported by every command module when the CLI starts: it imports nothing of the library (the
search's progress display is :mod:`dossier_cli.progress`, imported by the commands that search).
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

from rich.console import Console


def _console(stderr: bool) -> Console:
    """Lines are never hard-wrapped: in a terminal they wrap as the terminal wraps them;
    elsewhere (a pipe, a file, CI) a line is one line and tables are not truncated."""
    console = Console(stderr=stderr, highlight=False, soft_wrap=True)
    if not console.is_terminal and "COLUMNS" not in os.environ:
        console = Console(stderr=stderr, highlight=False, soft_wrap=True, width=UNWRAPPED)
    return console


UNWRAPPED = 10_000
"""Console width outside a terminal: wide enough that nothing is wrapped or cut."""
err = _console(stderr=True)
out = _console(stderr=False)


def print_json(data: Any) -> None:
    """Machine-readable output on stdout."""
    sys.stdout.write(json.dumps(data, indent=2, sort_keys=False, default=str) + "\n")


def fmt_speedup(speedup: float | None, lo: float | None, hi: float | None) -> str:
    """``1.234x [1.200, 1.270]`` or ``-``."""
    if speedup is None:
        return "-"
    return f"{speedup:.3f}x [{lo:.3f}, {hi:.3f}]"


def verdict_label(c: Any) -> str:
    """faster / slower / no significant effect, as the comparison recorded it (the same rule
    as :func:`dossier.verdict.speed_verdict`)."""
    return "faster" if c.faster else "slower" if c.slower else "no significant effect"
