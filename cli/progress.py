"""The search's progress on stderr (imported by the commands that tune, when they run)."""

from __future__ import annotations

from pathlib import Path
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
from dossier_cli.render import console as make_console
from dossier_cli.render import fmt_speedup, row_label


class ProgressObserver(TuneObserver):
    """A rich progress bar on stderr: trials done / total, current route, ETA."""

    def __init__(self, console: Console | None = None, verbose: bool = True) -> None:
        self.console = console if console is not None else make_console(stderr=True)
        self.verbose = verbose
        self.progress = Progress(
            TextColumn("[bold]tuning"), BarColumn(), MofNCompleteColumn(),
            TimeElapsedColumn(), TextColumn("eta"), TimeRemainingColumn(),
            TextColumn("{task.description}"), console=self.console, transient=True,
            # outside a terminal a bar is only noise (rich would print an empty line on stop)
            disable=not self.console.is_terminal)
        self.task: Any = None
        self.logs: dict[int, Path] = {}
        self.inferences = 1

    def __enter__(self) -> ProgressObserver:
        self.progress.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.progress.stop()

    def started(self, planned: int, done: int) -> None:
        self.task = self.progress.add_task("", total=max(planned, done), completed=done)
        if done:
            self.console.print(f"restored {done} finished trial(s) from the cache")

    def inferences_per_sample(self, n: int) -> None:
        self.inferences = max(n, 1)

    def trial_started(self, index: int, route: str, role: str) -> None:
        if self.task is not None:
            self.progress.update(self.task, description=f"[{index}] {route or '(default)'}")

    def trial_log(self, index: int, path: Path) -> None:
        self.logs[index] = path

    def trial_finished(self, record: TrialRecord) -> None:
        if self.task is not None and record.role != "confirm":
            self.progress.advance(self.task)
        log = self.logs.pop(record.index, None)
        if self.verbose:  # a failure names its worker log
            self.console.print(trial_line(record, log if record.outcome.value in FAILED
                                          and _said_something(log) else None,
                                          inferences=self.inferences))

    def confirming(self, routes: list[str]) -> None:
        self.console.print(f"confirming {len(routes)} candidate(s) in measuring processes of "
                           "their own (each with the baseline and a second load of it, the A/A)")

    def holdout(self, route: str) -> None:
        self.console.print(f"checking {route or '(default route)'} on the hold-out set",
                           markup=False)

    def measured_process(self, n: int, cap: int, open_routes: list[str]) -> None:
        if self.task is not None:
            self.progress.update(self.task, description=(
                f"confirmation: {n} measuring process(es) of at most {cap}, "
                f"{len(open_routes)} candidate(s) undecided"))


FAILED = frozenset({"build_failed", "crashed", "timeout", "runtime_error"})
"""Outcomes whose line names the trial's worker log (a rejected trial ran: its losses say why)."""
_STYLE = {"ok": "green", "rejected": "yellow", "build_failed": "red", "crashed": "red",
          "timeout": "red", "runtime_error": "red"}


def _said_something(log: Path | None) -> bool:
    try:
        return log is not None and log.stat().st_size > 0
    except OSError:
        return False


def trial_line(r: TrialRecord, log: Path | None = None, *, inferences: int = 1) -> str:
    """One line per finished trial; ``log``: its worker log, named at the end; ``inferences``:
    inferences in one timed sample (the figures are per inference)."""
    style = _STYLE.get(r.outcome.value, "white")
    parts = [f"[{r.index:>3}] {r.role:<8}", f"[{style}]{r.outcome.value:<13}[/]"]
    n = max(inferences, 1)
    if r.timing:
        p99 = r.timing.p99_ms
        parts.append(f"{r.timing.median_ms / n:8.4g} ms/inference"
                     + (f" (p99 {p99 / n:.4g})" if p99 is not None else ""))
    if r.comparison:
        c = r.comparison
        # the trial's own paired baseline: the speedup is this median over the one before
        what = "A/A load" if c.against == "aa" else "baseline"
        parts.append(f"vs {c.baseline.median_ms / n:.4g} {what} alongside")
        parts.append(fmt_speedup(c.speedup, c.speedup_ci_low, c.speedup_ci_high))
        parts.append(row_label(r))
    parts.append(escape(r.route) or "(default route)")
    if r.reason:
        parts.append(f"[dim]({escape(r.reason)})[/]")
    if log is not None:
        parts.append(f"log: {escape(str(log))}")
    return "  ".join(parts)
