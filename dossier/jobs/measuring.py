"""The confirmation's measuring processes on this host: one worker child each
(:class:`dossier.jobs.child.Child`), what :func:`dossier.measure.confirmation.confirm` calls as
its :class:`~dossier.measure.confirmation.MeasureProcess`. The statistics start no process;
the schedulers and ``verify --rebench`` hand them these."""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dossier.errors import TuneError
from dossier.knobs import KnobDatabase
from dossier.measure.confirmation import ProcessRun
from dossier.measure.timing import TimingSettings
from dossier.spec import ShapeEntry

if TYPE_CHECKING:
    from dossier.jobs.child import Child
    from dossier.jobs.worker import WorkerRequest

logger = logging.getLogger(__name__)


def local_processes(backend: str, validation: Path, settings: TimingSettings, *,
                    builder: dict[str, Any] | None = None, shapes: Sequence[ShapeEntry] = (),
                    work: Path, env: dict[str, str] | None = None,
                    knobs: KnobDatabase | None = None) -> LocalProcesses:
    """Measuring processes on this host: one worker child each (its timeout is the trial
    timeout, its memory limit the trial memory limit), requests and logs under ``work``;
    ``knobs``: the search's knob database, which each process then need not read again."""
    return LocalProcesses(backend, validation, settings, builder=builder, shapes=shapes,
                          work=work, env=env, knobs=knobs)


class LocalProcesses:
    """:class:`MeasureProcess` on this host (see :func:`local_processes`). With
    ``confirm_prestart``, each process that may have a successor starts it on standby
    (:class:`dossier.jobs.child.Child`) as it begins: the successor's interpreter start and imports
    overlap this one's loads, this one starts timing only once they are done, and the
    successor loads nothing until this one has ended."""

    on_this_host = True
    """The processes run here, so the confirmation watches this host's conditions around
    each (and waits for a quiet host when asked)."""

    def __init__(self, backend: str, validation: Path, settings: TimingSettings, *,
                 builder: dict[str, Any] | None, shapes: Sequence[ShapeEntry], work: Path,
                 env: dict[str, str] | None, knobs: KnobDatabase | None) -> None:
        from dossier.backends import get_backend
        from dossier.jobs.requests import new_request

        work.mkdir(parents=True, exist_ok=True)
        self.work, self.env = work, env
        self.prestart = get_backend(backend).prestarts(settings.confirm_prestart)
        self.base = new_request(backend, validation, settings, work=None, mode="measure",
                                builder=builder, shapes=shapes, knobs=knobs)
        self.next: Child | None = None
        """The process started on standby for the next turn, if any."""

    def _request(self, engines: Sequence[tuple[Path, str]], offset: int) -> WorkerRequest:
        return self.base.model_copy(update={
            "baseline_route": engines[0][1], "engines": [(str(p), r) for p, r in engines],
            "offset": offset})

    def _start(self, req: WorkerRequest, offset: int, standby: bool) -> Child:
        from dossier.jobs.child import Child

        return Child(req, self.work, f"measure-{offset}", self.env, standby=standby)

    def __call__(self, engines: Sequence[tuple[Path, str]], offset: int, /, *,
                 more: bool = True) -> ProcessRun:
        from dossier.jobs.worker import MeasuredResult

        req = self._request(engines, offset)
        t0 = time.perf_counter()
        child, self.next = self.next, None
        if more and self.prestart:
            # its request is a guess at the engines (go() hands it the final one); this
            # process times only once that one is past its imports
            self.next = self._start(self._request(engines, offset + 1), offset + 1, standby=True)
            req = req.model_copy(update={"then": (self.next.req.stage, self.next.proc.pid)})
        if child is not None:
            child.go(req)
            result = child.wait()
            if child.ended_on_standby():  # it measured nothing: a new process measures
                logger.info("%s: ended on standby (%s); measuring in a new process", child.name,
                            getattr(result, "reason", result.outcome))
                child = None
        if child is None:
            child = self._start(req, offset, standby=False)
            result = child.wait()
        wall = time.perf_counter() - t0
        if not isinstance(result, MeasuredResult):
            self.close()
            raise TuneError(f"confirmation: measuring process {offset + 1} ended "
                            f"{result.outcome}: {getattr(result, 'reason', '')}".strip(),
                            hint=f"its log is {child.log}")
        return ProcessRun(rounds=result.rounds, warmup_runs=result.warmup_runs, wall_s=wall,
                          phases_s=dict(result.phases_s), waited_share=result.waited_share)

    def close(self) -> None:
        """Stop the process on standby, if any (the confirmation has ended)."""
        child, self.next = self.next, None
        if child is not None:
            child.kill()
