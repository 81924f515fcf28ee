"""Where and at which priority a search measures: the declared target's cores and, for a
dedicated target, a raised scheduling priority (:mod:`dossier.measure.target`).

Applied to the process that runs the search (or ``verify --rebench``) for its duration and
restored after: every worker it starts (forked or spawned) inherits the affinity and the nice
value, so trial and measuring processes run pinned to the declared cores and ahead of ordinary
work on the host, which is as close to "the engine has these cores to itself" as a shared host
allows. What could not be done (no affinity on this platform, no permission to raise the
priority) is said in :attr:`Placement.notes`, never silently skipped.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Iterator
from dataclasses import dataclass, field

from dossier.measure.target import RAISED_NICE, TargetConditions, cores_for, usable_cores

logger = logging.getLogger(__name__)


@dataclass
class Placement:
    """What was applied: the cores measurements were pinned to and the nice value."""

    cores: list[int]
    nice: int | None
    """The nice value measurements ran at (None: not readable here)."""
    notes: list[str] = field(default_factory=list)
    """What the target asked that this host did not allow."""

    def text(self) -> str:
        """``pinned to cores 0-1, nice -10``."""
        cores = ", ".join(map(str, self.cores))
        nice = f", nice {self.nice}" if self.nice is not None else ""
        return f"pinned to core{'s' if len(self.cores) != 1 else ''} {cores}{nice}"


def _nice() -> int | None:
    try:
        return os.getpriority(os.PRIO_PROCESS, 0)
    except (OSError, AttributeError):
        return None


@contextlib.contextmanager
def placed(target: TargetConditions) -> Iterator[Placement]:
    """Pin this process to ``target``'s cores and, for a dedicated target with ``priority =
    "raise"``, raise its priority to nice :data:`RAISED_NICE`, for the duration; restored on
    exit (a lowered priority can always be restored: raising the nice value needs no
    privilege). A process started at a positive nice value (``nice -n 19 dossier ...``: its
    starter asked for a lower priority) keeps it, and the notes say so."""
    before_cores = usable_cores()
    before_nice = _nice()
    cores = cores_for(target, before_cores)
    notes: list[str] = []
    setter = getattr(os, "sched_setaffinity", None)
    pinned = False
    if setter is None:
        notes.append("this platform cannot pin a process to cores (no sched_setaffinity): "
                     "measurements ran on whichever cores the system chose")
    elif cores != before_cores:
        try:
            setter(0, cores)
            pinned = True
        except OSError as exc:
            notes.append(f"could not pin to cores {cores}: {exc.strerror}")
    raised = False
    if target.dedicated and target.priority == "raise" and before_nice is not None \
            and before_nice > 0:
        notes.append(f"started at nice {before_nice}, a lower priority than the default: kept "
                     "(whoever started it asked for it), so measurements competed with other "
                     "work on the host")
    elif target.dedicated and target.priority == "raise" and before_nice is not None \
            and before_nice > RAISED_NICE:
        try:
            os.setpriority(os.PRIO_PROCESS, 0, RAISED_NICE)
            raised = True
        except OSError:
            notes.append(f"the priority could not be raised to nice {RAISED_NICE} (not "
                         "permitted: run as a user with CAP_SYS_NICE, or accept measurements "
                         "that compete with other work on equal terms)")
    try:
        yield Placement(cores=cores, nice=_nice(), notes=notes)
    finally:
        if raised and before_nice is not None:
            with contextlib.suppress(OSError):
                os.setpriority(os.PRIO_PROCESS, 0, before_nice)
        if pinned and setter is not None:
            with contextlib.suppress(OSError):
                setter(0, before_cores)
