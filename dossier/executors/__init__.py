"""Executors: where the build and measure jobs of a search run.

The local executor is the tuner itself (no object here): build jobs in worker processes on this
host (:mod:`dossier.builds`), each trial measured in a child process (:mod:`dossier.child`).
:mod:`dossier.executors.ray_cluster` runs the same jobs, through the same worker code, on a Ray
cluster: builds as Ray tasks on CPU workers, measurement on one actor per GPU. Either way the
driver alone writes the tuning cache, in trial order.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

from dossier.errors import InputError

if TYPE_CHECKING:
    from dossier.confirmation import MeasureProcess
    from dossier.fingerprint import Fingerprint
    from dossier.routes import Route
    from dossier.timing import TimingSettings
    from dossier.tuner import Prepared, Tuner
    from dossier.worker import WorkerRequest, WorkerResult

EXECUTORS = ("local", "ray")


class Executor(Protocol):
    """Runs the jobs of one search for a :class:`~dossier.tuner.Tuner`."""

    notes: list[str]
    """One line per event the user should know of (a refused worker, a re-queued trial)."""

    def fingerprint(self) -> Fingerprint:
        """The fingerprint of the host that measures (written to the run folder)."""

    def attach(self, tuner: Tuner) -> None:
        """The search the jobs are for (its requests, engines and run folder)."""

    def want(self, route: Route, index: int) -> None:
        """``route`` will be measured as trial ``index``: its jobs may start ahead."""

    def trial(self, route: Route, index: int, req: WorkerRequest) -> tuple[WorkerResult, float]:
        """Trial ``index``'s result, and its build plus measure seconds; an ``ok`` trial's engine
        is written to ``req.engine`` (checked against its digest)."""

    def measure_process(self, timing: TimingSettings, env: dict[str, str]) -> MeasureProcess:
        """The confirmation's measuring processes (:mod:`dossier.confirmation`), each run on
        one device; ``env``: what the driver's processes would need (a worker computes its
        own)."""

    def drop_pending(self) -> None:
        """Forget jobs started ahead (the search ends or failed)."""

    def close(self) -> None:
        """Release the workers (and a Ray instance started for this search)."""


def open_executor(name: str, address: str | None, p: Prepared) -> Executor | None:
    """The executor ``name`` for the search ``p`` (None for the local one)."""
    if name == "local":
        if address is not None:
            raise InputError("--address is for --executor ray")
        return None
    if name == "ray":
        from dossier.executors.ray_cluster import RayExecutor

        return RayExecutor.open(address, p)
    raise InputError(f"unknown executor {name!r} (choose from {', '.join(EXECUTORS)})")
