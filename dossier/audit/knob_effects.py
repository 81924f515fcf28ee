"""Knob effects, for ``dossier explain``.

Knob effects are given two ways. **One knob at a time**: a trial whose route differs from the
baseline in exactly one knob was timed interleaved with the baseline, so its comparison is that
knob value's effect (speedup with its bootstrap interval). **A model over all admissible
trials**, when there are enough of them: ordinary least squares of log(speedup against the
baseline timed alongside) on one-hot knob values (the baseline's value is the reference), with
analytic standard errors and t-distribution intervals; the effect of a value is exp(coefficient),
a speed factor against the baseline's value of that knob with the other knobs held fixed.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np

from dossier.audit.explain_model import KnobModel, ModelEffect, OneKnobEffect
from dossier.measure.timing import TimingSettings
from dossier.trial import TrialRecord


def confirmation_of(trials: Sequence[TrialRecord], route: str) -> TrialRecord | None:
    """The last confirmation record of ``route`` with a reading (a candidate's, not the A/A)."""
    base = next((t.route for t in trials if t.role == "baseline"), None)
    return next((t for t in reversed(trials) if t.role == "confirm" and t.route == route
                 and t.route != base and t.comparison is not None), None)


def one_knob_effects(main: Sequence[TrialRecord], values: Mapping[int, Mapping[str, str]],
                      baseline: TrialRecord, settings: TimingSettings,
                      trials: Sequence[TrialRecord] = (),
                      contention: frozenset[str] = frozenset()) -> list[OneKnobEffect]:
    base = values.get(baseline.index, {})
    out = []
    for t in main:
        if t.role != "search" or t.comparison is None:
            continue
        mine = values.get(t.index, {})
        diff = [k for k in sorted(set(base) | set(mine)) if base.get(k) != mine.get(k)]
        if len(diff) != 1:
            continue
        c = t.comparison
        confirmed = confirmation_of(trials, t.route)
        if confirmed is not None and confirmed.comparison is not None:  # it decides
            c = confirmed.comparison
        verdict = c.verdict(settings.min_effect).label
        out.append(OneKnobEffect(
            knob=diff[0], value=mine.get(diff[0], ""), baseline_value=base.get(diff[0], ""),
            trial_index=t.index, outcome=t.outcome, speedup=c.speedup,
            speedup_ci_low=c.speedup_ci_low, speedup_ci_high=c.speedup_ci_high,
            p_value=c.p_value, verdict=verdict,
            source="confirmation" if confirmed is not None else "screening",
            screened_speedup=t.comparison.speedup if confirmed is not None else None,
            contention_sensitive=diff[0] in contention))
    return sorted(out, key=lambda e: (e.knob, e.value))


MODEL_METHOD = ("ordinary least squares (numpy lstsq) of log(speedup against the baseline timed "
                "interleaved in the same trial) on one-hot knob values, the baseline's value "
                "as reference, with an intercept; analytic standard errors, t-distribution "
                "intervals; effect = exp(coefficient), a speed factor with the other knobs "
                "fixed")


def fit_knob_model(main: Sequence[TrialRecord], values: Mapping[int, Mapping[str, str]],
                   baseline: TrialRecord, confidence: float = 0.95) -> KnobModel:
    """Fit the knob model over the admissible baseline and search trials (see module doc).

    Fitted only when there are at least two residual degrees of freedom and the knob values
    are not confounded; otherwise ``fitted`` is False and ``note`` says why.
    """
    rows = [t for t in main if t.admissible and t.comparison is not None
            and t.comparison.speedup > 0]
    base = values.get(baseline.index, {})
    varied = sorted(k for k in base if len({values.get(t.index, {}).get(k) for t in main}) > 1)
    columns = [(k, v) for k in varied
               for v in sorted({values.get(t.index, {}).get(k, "") for t in rows})
               if v != base.get(k)]
    n, p = len(rows), len(columns) + 1

    def _unfitted(note: str) -> KnobModel:
        return KnobModel(fitted=False, method=MODEL_METHOD, note=note, trials=n, parameters=p,
                         residual_std=None, r_squared=None, effects=[])

    if not columns:
        return _unfitted("no knob value other than the baseline's was admissible; only the "
                        "one-knob-at-a-time effects (if any) are measured")
    if n - p < 2:
        return _unfitted(f"{n} admissible trial(s) for {p} coefficients: at least {p + 2} are "
                        "needed (two residual degrees of freedom); see the one-knob-at-a-time "
                        "effects")
    x = np.ones((n, p))
    for j, (k, v) in enumerate(columns, start=1):
        x[:, j] = [1.0 if values.get(t.index, {}).get(k) == v else 0.0 for t in rows]
    y = np.log([t.comparison.speedup for t in rows if t.comparison is not None])
    if np.linalg.matrix_rank(x) < p:
        return _unfitted("the knob values seen in admissible trials are confounded (some "
                        "always change together), so their effects cannot be told apart")
    from scipy import stats

    beta, *_ = np.linalg.lstsq(x, y, rcond=None)
    resid = y - x @ beta
    dof = n - p
    sigma2 = float(resid @ resid) / dof
    cov = sigma2 * np.linalg.inv(x.T @ x)
    se = np.sqrt(np.clip(np.diag(cov), 0.0, None))
    tq = float(stats.t.ppf((1 + confidence) / 2, dof))
    total = float(((y - y.mean()) ** 2).sum())
    effects = [ModelEffect(knob=k, value=v, reference=base.get(k, ""),
                           speed_factor=math.exp(beta[j]),
                           ci_low=math.exp(beta[j] - tq * se[j]),
                           ci_high=math.exp(beta[j] + tq * se[j]), std_error=float(se[j]),
                           trials=int(x[:, j].sum()))
               for j, (k, v) in enumerate(columns, start=1)]
    return KnobModel(fitted=True, method=MODEL_METHOD,
                     note=f"{n} admissible trials, {p} coefficients, {dof} residual degrees of "
                     "freedom; assumes knob effects multiply (no interactions)",
                     trials=n, parameters=p, residual_std=math.sqrt(sigma2),
                     r_squared=1 - float(resid @ resid) / total if total > 0 else None,
                     effects=effects)
