"""Schedulers: where the build and measure jobs of a search run (``--executor``).

Each scheduler implements :class:`~dossier.executors.interface.Scheduler`. It gets the jobs'
requests from a :class:`~dossier.jobs.requests.JobRequests` and which routes share a build from
the search's :class:`~dossier.build_plan.BuildPlan`, never from the tuner. The local one
(:mod:`dossier.executors.local`) runs build jobs in worker processes on this host
(:mod:`dossier.jobs.builds`) and measures each trial in a child process (:mod:`dossier.jobs.child`);
:mod:`dossier.executors.ray_cluster` runs the same jobs, through the same worker code, on a Ray
cluster: builds as Ray tasks on CPU workers, measurement on one actor per GPU. Either way the
driver alone writes the tuning cache, in trial order.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from dossier.errors import InputError
from dossier.executors.interface import Scheduler

if TYPE_CHECKING:
    from pathlib import Path

    from dossier.backends import Backend

EXECUTORS = ("local", "ray")


def open_scheduler(name: str, address: str | None, backend: Backend, model: Path,
                   validation: Path) -> Scheduler | None:
    """The remote scheduler ``name`` for a search of ``model`` judged on the validation set at
    ``validation`` (None for the local one, which the tuner makes itself)."""
    if name == "local":
        if address is not None:
            raise InputError("--address is for --executor ray")
        return None
    if name == "ray":
        from dossier.executors.ray_cluster import RayScheduler

        return RayScheduler.open(address, backend, model, validation)
    raise InputError(f"unknown executor {name!r} (choose from {', '.join(EXECUTORS)})")


__all__ = ["EXECUTORS", "Scheduler", "open_scheduler"]
