"""The tuner: strategy x backend x validation x timing, one child process per trial.

The tuner never prints; it reports progress to a :class:`TuneObserver`. Everything it learns is
appended to the tuning cache as it happens, so ``tune --continue`` picks up where a killed
search stopped: finished trials are never re-run, the best so far is never lost.

Its modules, one reason to change each: :mod:`~dossier.tuner.prepare` (a spec resolved and
checked), :mod:`~dossier.tuner.data_sets` (the calibration and hold-out sets),
:mod:`~dossier.tuner.resume` (the tuning cache's header and what ``--continue`` checks),
:mod:`~dossier.tuner.search` (the loop, :class:`Tuner`), :mod:`~dossier.tuner.trials` (a
trial's record), :mod:`~dossier.tuner.confirm` (the confirmation), :mod:`~dossier.tuner.gate`
(the hold-out gate), :mod:`~dossier.tuner.session` (one session over a run folder:
:func:`tune`, :func:`continue_tune`) and :mod:`~dossier.tuner.observer`.
"""

from __future__ import annotations

from dossier.tuner.observer import TuneObserver
from dossier.tuner.prepare import Prepared, plan, prepare
from dossier.tuner.search import Tuner
from dossier.tuner.session import COTENANT_MAX_S, TuneResult, continue_tune, tune

__all__ = ["COTENANT_MAX_S", "Prepared", "TuneObserver", "TuneResult", "Tuner", "continue_tune",
           "plan", "prepare", "tune"]
