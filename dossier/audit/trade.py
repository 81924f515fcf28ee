"""The accuracy-speed trade of a search: per route, its worst loss per output against the
threshold and its speed, the frontier of the routes no other route beats on both, the routes
the accuracy filter rejected, and the hold-out reading beside the validation reading.

Speeds are the confirmation's readings where the confirmation measured a route, else the
screening's (marked as such): the same figure the decision and the head-to-head show.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal, get_args

from pydantic import BaseModel, ConfigDict

from dossier.bundle.overview import OutputWorst
from dossier.cache import DecisionRecord, HoldoutRecord
from dossier.measure.confirmation import Status
from dossier.trial import Outcome, TrialRecord
from dossier.validation import worst_by_output


class _Model(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class TradePoint(_Model):
    """One route of the trade."""

    route: str
    """The route."""
    trial_index: int
    """Its search (or baseline) trial."""
    outcome: Literal["ok", "rejected"]
    """ok: passed the accuracy filter; rejected: a loss reached the threshold."""
    worst_loss: float | None
    """Its largest loss on the validation set (None: NaN or Inf)."""
    outputs: list[OutputWorst]
    """Per output, its worst loss on the validation set."""
    speedup: float | None
    """Its speed over the baseline (None: not timed)."""
    speedup_ci_low: float | None
    """Lower end of that reading's interval."""
    speedup_ci_high: float | None
    """Upper end."""
    reading: Literal["confirmed", "screened", "baseline"]
    """Which measurement ``speedup`` is: the confirmation's (``confirmed``, whatever it
    concluded: see ``confirmation``), the screening's alone, or the baseline itself (1.0)."""
    confirmation: Status | None = None
    """What the confirmation concluded of it (None: not confirmed, or a record that keeps no
    conclusion): confirmed faster; futile (its interval below the minimum effect); outranked
    (its interval below a confirmed route's, or, paired with it process by process, not faster
    than it by the minimum effect); undecided at the cap."""
    frontier: bool
    """Admissible, and no other admissible route is both faster and more accurate."""
    holdout_passed: bool | None = None
    """Its check on the hold-out set (None: not checked)."""
    holdout_worst_loss: float | None = None
    """Its largest loss on the hold-out set."""
    shipped: bool = False
    """Its engine ships."""


class Trade(_Model):
    """The accuracy-speed trade of a search: ``explain``'s section of the same name."""

    metric: str
    """The loss."""
    threshold: float
    """A route is admissible when every loss is below this."""
    points: list[TradePoint]
    """Every route that was validated, fastest first."""
    rejected_for_accuracy: int
    """Routes the accuracy filter rejected."""
    holdout_pairs: int | None
    """Pairs of the hold-out set (None: the search had none)."""
    holdout_rejected: list[str]
    """Routes confirmed faster that failed the hold-out set, and so did not ship."""


def trade(trials: Sequence[TrialRecord], decision: DecisionRecord, threshold: float,
          metric: str, holdouts: Sequence[HoldoutRecord] = (),
          holdout_pairs: int | None = None) -> Trade:
    """The trade of a finished search (its trials, decision and hold-out checks)."""
    confirmed = {t.route: t for t in trials if t.role == "confirm" and t.comparison}
    checks = {h.route: h for h in holdouts}
    points = []
    for t in trials:
        if t.role == "confirm" or t.outcome not in (Outcome.OK, Outcome.REJECTED):
            continue
        c = confirmed.get(t.route)
        reading: Literal["confirmed", "screened", "baseline"]
        if t.role == "baseline":
            reading, speed, lo, hi = "baseline", 1.0, None, None
        elif c is not None and c.comparison is not None:
            reading = "confirmed"
            speed, lo, hi = (c.comparison.speedup, c.comparison.speedup_ci_low,
                             c.comparison.speedup_ci_high)
        elif t.comparison is not None:
            reading = "screened"
            speed, lo, hi = (t.comparison.speedup, t.comparison.speedup_ci_low,
                             t.comparison.speedup_ci_high)
        else:
            reading, speed, lo, hi = "screened", None, None, None
        h = checks.get(t.route)
        points.append(TradePoint(
            route=t.route, trial_index=t.index,
            outcome="ok" if t.outcome is Outcome.OK else "rejected",
            worst_loss=t.worst_loss,
            outputs=[OutputWorst(output=o, loss=loss, pair=p)
                     for o, (p, loss) in worst_by_output(t.losses).items()],
            speedup=speed, speedup_ci_low=lo, speedup_ci_high=hi, reading=reading,
            frontier=False, confirmation=_concluded(c),
            holdout_passed=h.passed if h else None,
            holdout_worst_loss=h.worst_loss if h else None,
            shipped=t.index == decision.shipped_index))
    points = _mark_frontier(points)
    points.sort(key=lambda p: -(p.speedup or 0.0))
    return Trade(metric=metric, threshold=threshold, points=points,
                 rejected_for_accuracy=sum(p.outcome == "rejected" for p in points),
                 holdout_pairs=holdout_pairs, holdout_rejected=list(decision.holdout_rejected))


def _concluded(c: TrialRecord | None) -> Status | None:
    """What the confirmation record ``c`` concluded, as it recorded it (None: a value that is
    no :data:`~dossier.measure.confirmation.Status`, as a crafted record may hold)."""
    found = c.extra.get("confirmation") if c is not None else None
    return next((s for s in get_args(Status) if s == found), None)


def _mark_frontier(points: list[TradePoint]) -> list[TradePoint]:
    """Mark the admissible routes no other admissible route beats on both speed and loss."""
    ok = [p for p in points if p.outcome == "ok" and p.speedup is not None
          and p.worst_loss is not None]

    def beaten(p: TradePoint) -> bool:
        return any(q is not p and q.speedup >= p.speedup  # type: ignore[operator]
                   and q.worst_loss <= p.worst_loss  # type: ignore[operator]
                   and (q.speedup > p.speedup or q.worst_loss < p.worst_loss)  # type: ignore[operator]
                   for q in ok)

    front = {p.trial_index for p in ok if not beaten(p)}
    return [p.model_copy(update={"frontier": p.trial_index in front}) for p in points]


def informative(t: Trade) -> bool:
    """Whether the trade says more than "every route passed by far": a route was rejected for
    accuracy, a hold-out set was checked, or the admissible routes' losses differ by more than
    tenfold (a route that changes the numbers)."""
    losses = [p.worst_loss for p in t.points if p.worst_loss is not None and p.worst_loss > 0]
    spread = bool(losses) and max(losses) > 10 * min(losses)
    return t.rejected_for_accuracy > 0 or t.holdout_pairs is not None or spread
