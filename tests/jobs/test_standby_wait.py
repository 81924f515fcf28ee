"""A process on standby that stalls is charged to no route: the trial waiting for its imports
does not have that wait counted against its time limit, and a standby not ready in time is
killed, its trial then run in a process of its own."""

from __future__ import annotations

import logging
import os
import signal
from pathlib import Path

import pytest
from conftest import TINY_TIMING

from dossier.trial import Outcome
from dossier.tuner import tune

SELECTION = "-intra_op_num_threads=[0|1]"
"""Two trials under fast: the baseline, and a route reusing its engine."""


def test_a_stalled_standby_costs_no_route_its_time(sample, tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch,
                                                   caplog: pytest.LogCaptureFixture) -> None:
    """The first process started on standby is stopped (SIGSTOP) before its imports: the
    baseline trial waits for it longer than its own time limit, yet is not killed; the
    stalled process is killed after the wait's bound and the second trial runs in a new
    process, logged."""
    from dossier.jobs.child import Child

    monkeypatch.setenv("DOSSIER_STANDBY_WAIT_S", "6")
    init, stopped = Child.__init__, []

    def stalls(self: Child, *args: object, **kw: object) -> None:
        init(self, *args, **kw)  # type: ignore[arg-type]
        if kw.get("standby") and not stopped:
            os.killpg(self.proc.pid, signal.SIGSTOP)
            stopped.append(self.name)

    monkeypatch.setattr(Child, "__init__", stalls)
    _, spec = sample("convnet", strategy="fast", selection=SELECTION)
    timing = TINY_TIMING.model_copy(update={"trial_prestart": True, "trial_timeout_s": 4})
    with caplog.at_level(logging.INFO, logger="dossier.executors.local"):
        res = tune(spec.model_copy(update={"timing": timing}), tmp_path / "run", build_jobs=1)
    assert stopped == ["standby-0000"]
    trials = [t for t in res.cache.trials if t.role != "confirm"]
    assert [t.outcome for t in trials] == [Outcome.OK, Outcome.OK], [t.reason for t in trials]
    assert any("standby-0000: ended on standby (killed" in r.getMessage()
               for r in caplog.records), [r.getMessage() for r in caplog.records]
