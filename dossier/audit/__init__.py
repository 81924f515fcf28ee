"""Auditing bundles: why a route was chosen (:func:`explain`), what changed between two
bundles (:func:`diff_bundles`), when the search pays back (:func:`payback`), and a
self-contained HTML report (:func:`render_report`, needs the ``report`` extra: plotly)."""

from __future__ import annotations

from dossier.audit.diff import BundleDiff, Change, KnobRow, diff_bundles
from dossier.audit.explain import Explanation, explain, explain_search, fit_knob_model
from dossier.audit.payback import Payback, PaybackCase, payback, saved_ms

__all__ = [
    "BundleDiff",
    "Change",
    "diff_bundles",
    "explain",
    "explain_search",
    "Explanation",
    "fit_knob_model",
    "KnobRow",
    "Payback",
    "payback",
    "PaybackCase",
    "saved_ms",
]
