"""Does the accuracy threshold reject anything? Checked before a search.

A route is rejected when a loss reaches the threshold. At or above the top of the metric's range
(``l0`` is a fraction, at most 1; ``cos``, 1 - cosine similarity, at most 2) only an output as
wrong as can be would reach it: the search is refused. For the unbounded metrics (``l1``, ``l2``, ``linf``), a threshold above the
loss an all-zero output has on every output of every pair (its mean absolute value, mean square
or largest magnitude) would let an engine that outputs only zeros pass: that is warned about,
naming the scale of the references.
"""

from __future__ import annotations

import logging

import numpy as np

from dossier.errors import SpecError
from dossier.validation import ValidationSet, loss

logger = logging.getLogger(__name__)

RANGE = {"l0": 1.0, "cos": 2.0}
"""The largest loss a bounded metric can give."""


def zero_output_loss(metric: str, vset: ValidationSet) -> float | None:
    """The largest loss an all-zero output would have over every output of every pair: an
    all-zero engine passes when the threshold is above it (None for the bounded metrics,
    whose range says it all, or without float outputs)."""
    if metric in RANGE:
        return None
    got = [loss(metric, np.zeros_like(ref, dtype=np.float64), ref)
           for p in vset.pairs for ref in p.references.values()
           if np.issubdtype(ref.dtype, np.inexact) and ref.size]
    vals = [v for v in got if v is not None]
    return max(vals) if vals else None


def check_threshold(metric: str, threshold: float, vset: ValidationSet) -> None:
    """Refuse a threshold only the worst possible loss of ``metric`` reaches (SpecError); warn when an all-zero
    output would pass on every output of ``vset``."""
    top = RANGE.get(metric)
    if top is not None and threshold >= top:
        raise SpecError(f"threshold {threshold:g} cannot reject anything but an output as wrong "
                        f"as can be: the {metric} loss is at most {top:g}",
                        hint=f"give a threshold below {top:g} (e.g. 1e-3 for {metric})")
    zero = zero_output_loss(metric, vset)
    if zero and threshold > zero:  # all-zero references (zero == 0): zeros are the answer
        logger.warning("threshold %g is above the %s loss of an all-zero output on every output "
                       "of the validation set (%.3g at most): an engine that outputs zeros "
                       "would pass; give a threshold below the references' scale",
                       threshold, metric, zero)
