"""What a search tells its observer: the CLI renders it (the tuner never prints)."""

from __future__ import annotations

from pathlib import Path

from dossier.trial import TrialRecord


class TuneObserver:
    """Receives progress; the CLI renders it. Every method is optional."""

    def started(self, planned: int, done: int) -> None:
        """The search starts: ``planned`` trials (an upper bound for mixed), ``done`` restored."""

    def trial_started(self, index: int, route: str, role: str) -> None:
        """A trial's child process starts."""

    def inferences_per_sample(self, n: int) -> None:
        """A timed sample runs ``n`` inferences (before ``started``; ``[timing] inputs``)."""

    def trial_finished(self, record: TrialRecord) -> None:
        """A trial's record was written to the cache."""

    def trial_log(self, index: int, path: Path) -> None:
        """Trial ``index``'s worker log: what its process printed (kept when it fails)."""

    def confirming(self, routes: list[str]) -> None:
        """The best candidates are being re-timed against the baseline."""

    def holdout(self, route: str) -> None:
        """``route`` is being checked on the hold-out set."""

    def measured_process(self, n: int, cap: int, open_routes: list[str]) -> None:
        """The confirmation's ``n``-th measuring process finished (at most ``cap``);
        ``open_routes``: the candidates still undecided."""

