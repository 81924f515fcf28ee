"""The scheduler interface: where the build and measure jobs of a search run."""

from __future__ import annotations

from collections.abc import Callable, Generator, Sequence
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from dossier.fingerprint import Fingerprint
    from dossier.jobs.requests import CheckJob, JobRequests, TrialJob
    from dossier.jobs.worker import WorkerResult
    from dossier.measure.confirmation import MeasureProcess
    from dossier.measure.timing import TimingSettings
    from dossier.routes import Route


class Scheduler(Protocol):
    """Runs the jobs of one search. It gets their requests from the search's
    :class:`~dossier.jobs.requests.JobRequests` and which routes share a build from its
    :class:`~dossier.build_plan.BuildPlan`; the tuner alone records what they return."""

    notes: list[str]
    """One line per event the user should know of (a refused worker, a re-queued trial)."""
    measures_here: bool
    """Whether trials are timed on this host: what the host does meanwhile is then recorded
    with each (:mod:`dossier.measure.conditions`)."""

    def fingerprint(self) -> Fingerprint:
        """The fingerprint of the host that measures (written to the run folder)."""

    def attach(self, requests: JobRequests) -> None:
        """The search the jobs are for: the factory of their requests."""

    def want(self, route: Route, index: int) -> None:
        """``route`` will be measured as trial ``index``: its build may start ahead."""

    def trial(self, route: Route, index: int, job: TrialJob,
              started: Callable[[], None]) -> tuple[WorkerResult, float]:
        """Trial ``index``'s result, and its build plus measure seconds; ``started`` is
        called when the trial's turn comes (locally: once its build is done, as its
        measurement starts). An ``ok`` trial's engine is written to ``job.req.engine``; a
        ``job.reuse`` engine is placed there before the measure job starts."""

    def measure_process(self, timing: TimingSettings, env: dict[str, str]) -> MeasureProcess:
        """The confirmation's measuring processes (:mod:`dossier.measure.confirmation`), each run on
        one device; ``env``: what the driver's processes would need (a remote worker computes
        its own)."""

    def check(self, jobs: Sequence[CheckJob]) -> Generator[WorkerResult, None, None]:
        """Each check job's result (the hold-out check), in the order of ``jobs``; every job
        is started before the first is awaited (nothing is timed meanwhile). Closed early (an
        interrupt), it leaves none of its processes running."""

    def drop_pending(self) -> None:
        """Forget jobs started ahead (the search ends or failed)."""

    def close(self) -> None:
        """Release the workers (and a Ray instance started for this search)."""
