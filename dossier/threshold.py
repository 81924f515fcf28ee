"""Does the accuracy threshold reject anything? Checked before a search.

A route is rejected when a loss reaches the threshold. At or above the top of the metric's range
(``l0`` is a fraction, at most 1; ``cos``, 1 - cosine similarity, at most 2) only an output as
wrong as can be would reach it: the search is refused. Below it, a threshold can still switch
the check off, and every metric is warned about the same way:

- above the loss of an output that carries no information, on every output of every pair: an
  all-zero output for ``l0``, ``l1``, ``l2`` and ``linf`` (the fraction of reference elements
  away from zero, their mean absolute value, mean square or largest magnitude), a constant
  output for ``cos`` (scale-free, so the best constant, not zero, is the no-information
  answer: near 1 for references centred on zero, near 0 for all-positive ones);
- for the bounded metrics, at or above half their range's top but one: ``l0`` 0.5 (half the
  elements may be wrong), ``cos`` 0.5 (outputs at a cosine similarity of 0.5, 60 degrees off,
  pass).

The warning names the bar, so ``cos`` 0.9 (a cosine similarity of 0.1 passes) is said as
plainly as ``linf`` 1e9.
"""

from __future__ import annotations

import logging

import numpy as np

from dossier.errors import SpecError
from dossier.validation import ValidationSet, loss

logger = logging.getLogger(__name__)

RANGE = {"l0": 1.0, "cos": 2.0}
"""The largest loss a bounded metric can give."""
LOOSE = {"l0": 0.5, "cos": 0.5}
"""A bounded metric's threshold at or above which the check lets nearly anything through:
half the elements wrong (``l0``), a cosine similarity of 0.5 (``cos``)."""


def _constant_loss(reference: np.ndarray) -> float:
    """The cos loss of the best constant output against ``reference``: 1 - |sum r| /
    (sqrt(n) ||r||)."""
    r = np.asarray(reference, dtype=np.float64).ravel()
    norm = float(np.linalg.norm(r))
    if r.size == 0 or norm == 0.0:
        return 0.0
    return max(0.0, 1.0 - abs(float(r.sum())) / (float(np.sqrt(r.size)) * norm))


def zero_output_loss(metric: str, vset: ValidationSet, *, atol: float = 1e-5,
                     rtol: float = 1e-5) -> float | None:
    """The largest loss an output that carries no information would have over every output of
    every pair (all zeros; a constant for ``cos``): such an engine passes when the threshold is
    above it (None without float outputs)."""
    refs = [ref for p in vset.pairs for ref in p.references.values()
            if np.issubdtype(ref.dtype, np.inexact) and ref.size]
    if metric == "cos":
        return max((_constant_loss(r) for r in refs), default=None)
    got = [loss(metric, np.zeros_like(ref, dtype=np.float64), ref, atol=atol, rtol=rtol)
           for ref in refs]
    vals = [v for v in got if v is not None]
    return max(vals) if vals else None


def check_threshold(metric: str, threshold: float, vset: ValidationSet, *, atol: float = 1e-5,
                    rtol: float = 1e-5) -> None:
    """Refuse a threshold only the worst possible loss of ``metric`` reaches (SpecError); warn
    when it switches the check off (see the module's text)."""
    top = RANGE.get(metric)
    if top is not None and threshold >= top:
        raise SpecError(f"threshold {threshold:g} cannot reject anything but an output as wrong "
                        f"as can be: the {metric} loss is at most {top:g}",
                        hint=f"give a threshold below {top:g} (e.g. 1e-3 for {metric})")
    zero = zero_output_loss(metric, vset, atol=atol, rtol=rtol)
    answer = "a constant output" if metric == "cos" else "an all-zero output"
    if zero and threshold > zero:  # zero == 0: zeros (a constant) are the answer
        logger.warning("threshold %g switches the check off: it is above the %s loss of %s "
                       "on every output of the validation set (%.3g at most): an engine that "
                       "outputs %s would pass; "
                       "give a threshold below the references' scale", threshold, metric,
                       answer, zero, "a constant" if metric == "cos" else "zeros")
        return
    loose = LOOSE.get(metric)
    if loose is not None and threshold >= loose:
        what = (f"outputs at a cosine similarity of {1 - threshold:g} pass" if metric == "cos"
                else f"outputs with {threshold:.0%} of their elements wrong pass")
        logger.warning("threshold %g for %s switches the check off: %s; give a "
                       "threshold near the loss you accept (e.g. 1e-3)", threshold, metric, what)
