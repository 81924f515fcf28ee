"""Rendering for the CLI: status and progress go to stderr, reports to stdout."""

from __future__ import annotations

import json
import os
import sys
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

from dossier.trial import TrialRecord
from dossier.tuner import TuneObserver


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


class ProgressObserver(TuneObserver):
    """A rich progress bar on stderr: trials done / total, current route, ETA."""

    def __init__(self, console: Console = err, verbose: bool = True) -> None:
        self.console = console
        self.verbose = verbose
        self.progress = Progress(
            TextColumn("[bold]tuning"), BarColumn(), MofNCompleteColumn(),
            TimeElapsedColumn(), TextColumn("eta"), TimeRemainingColumn(),
            TextColumn("{task.description}"), console=console, transient=True)
        self.task: Any = None

    def __enter__(self) -> ProgressObserver:
        self.progress.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.progress.stop()

    def started(self, planned: int, done: int) -> None:
        self.task = self.progress.add_task("", total=max(planned, done), completed=done)
        if done:
            self.console.print(f"restored {done} finished trial(s) from the cache")

    def trial_started(self, index: int, route: str, role: str) -> None:
        if self.task is not None:
            self.progress.update(self.task, description=f"[{index}] {route or '(default)'}")

    def trial_finished(self, record: TrialRecord) -> None:
        if self.task is not None and record.role != "confirm":
            self.progress.advance(self.task)
        if self.verbose:
            self.console.print(trial_line(record))

    def confirming(self, routes: list[str]) -> None:
        self.console.print(f"confirming {len(routes)} candidate(s) against the baseline "
                           "independently (one fresh process per engine, with an A/A)")


_STYLE = {"ok": "green", "rejected": "yellow", "build_failed": "red", "crashed": "red",
          "timeout": "red", "runtime_error": "red"}


def trial_line(r: TrialRecord) -> str:
    """One line per finished trial."""
    style = _STYLE.get(r.outcome.value, "white")
    parts = [f"[{r.index:>3}] {r.role:<8}", f"[{style}]{r.outcome.value:<13}[/]"]
    if r.timing:
        parts.append(f"{r.timing.median_ms:8.3f} ms")
    if r.comparison:
        c = r.comparison
        # the trial's own paired baseline: the speedup is this median over the one before
        parts.append(f"vs {c.baseline.median_ms:.3f} ms baseline alongside")
        parts.append(fmt_speedup(c.speedup, c.speedup_ci_low, c.speedup_ci_high))
        parts.append("A/A: " + verdict_label(c) if r.role == "baseline" else verdict_label(c))
    parts.append(escape(r.route) or "(default route)")
    if r.reason:
        parts.append(f"[dim]({escape(r.reason)})[/]")
    return "  ".join(parts)
