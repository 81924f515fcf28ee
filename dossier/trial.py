"""Trials: one route built, validated and timed, and the record it leaves.

A trial's outcome is data, never an exception: ``ok``, ``rejected`` (accuracy), ``build_failed``,
``crashed`` (the child died: a signal, no result), ``timeout`` or ``runtime_error``.

The models live at the bottom of :mod:`dossier.measure` (:mod:`dossier.measure.reading`: the
timing summary, the comparison and the reading; :mod:`dossier.measure.record`: the outcome and
the trial record), so that the measurement needs nothing above it; this module is the name
the library imports them by.
"""

from __future__ import annotations

from dossier.measure.reading import AHEAD, Comparison, Reading, TimingSummary, stopped_ahead
from dossier.measure.record import Outcome, Shipped, TrialRecord

__all__ = ["AHEAD", "Comparison", "Outcome", "Reading", "Shipped", "TimingSummary", "TrialRecord",
           "stopped_ahead"]
