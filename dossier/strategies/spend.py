"""How a budgeted search spends its budget, as a pure function of its trials in order.

The ``budget`` strategy asks :func:`account` before each proposal whether to go on, and ``explain``
asks it afterwards why the search stopped: one rule, read from the same records, so what the
search did and what it says it did cannot drift apart.

The stopping rule, besides the budget itself: after the structured start, a search that has
measured ``patience`` new routes in a row, none of them faster than the best route so far by the
minimum effect, stops. With ``n`` misses in a row the chance that the next proposal beats the best
is, at 95% confidence, below ``1 - 0.05 ** (1 / n)`` (about ``3 / n``, the rule of three): 6% at
the default patience of 50. That is what "no proposal is expected to beat the best route by the
minimum effect" means here, and it is why the rule needs no model of its own.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

from dossier.measure.reading import reaches_effect
from dossier.trial import Outcome

DEFAULT_PATIENCE = 50
"""Proposals in a row without a gain of the minimum effect before the search stops."""
CONFIDENCE = 0.95
"""Confidence of the bound on the chance that another proposal helps."""


class _Speedup(Protocol):
    @property
    def speedup(self) -> float:
        """Baseline / candidate latency."""


class Scored(Protocol):
    """What the budget needs of a finished trial (a :class:`~dossier.trial.TrialRecord` is one)."""

    @property
    def route(self) -> str:
        """Canonical route text."""

    @property
    def outcome(self) -> Outcome:
        """How it ended."""

    @property
    def comparison(self) -> _Speedup | None:
        """Its speedup over the baseline timed alongside (None when untimed)."""

    @property
    def trial_s(self) -> float:
        """Wall time of the trial."""


@dataclass(frozen=True)
class Limits:
    """A budget and the stopping rule's settings."""

    max_builds: int | None = None
    """Routes measured at most (the baseline and the structured start included)."""
    max_search_s: float | None = None
    """Seconds of trials (sum of their wall times) at most."""
    min_effect: float = 0.02
    """A gain smaller than this does not count as an improvement."""
    patience: int = DEFAULT_PATIENCE
    """Proposals in a row without a gain of ``min_effect`` before the search stops."""


@dataclass
class Account:
    """Where a budgeted search stands."""

    builds: int = 0
    """Routes measured."""
    search_s: float = 0.0
    """Their wall time, summed."""
    best: float = 1.0
    """The best admissible speedup measured so far (the baseline: 1.0)."""
    best_route: str | None = None
    """Its route."""
    misses: int = 0
    """Proposals since the last one that beat the best by the minimum effect."""
    improved_at: list[int] = field(default_factory=list)
    """Positions (0-based, in measuring order) of the trials that raised the best by the minimum
    effect."""
    stop: str | None = None
    """Why the search stops now (None: it goes on)."""

    def chance_bound(self) -> float:
        """95% upper bound on the chance that the next proposal beats the best by the minimum
        effect, from the misses in a row (1.0 before any)."""
        return 1.0 - (1.0 - CONFIDENCE) ** (1.0 / self.misses) if self.misses else 1.0


def speedup(t: Scored) -> float | None:
    """A trial's measured speedup when it is admissible and timed, else None."""
    if t.outcome is not Outcome.OK:
        return None
    return t.comparison.speedup if t.comparison is not None else 1.0


def account(trials: Sequence[Scored], limits: Limits, start: int) -> Account:
    """The account after ``trials`` (the search's trials in measuring order, baseline first);
    the first ``start`` of them are the structured start (the patience rule begins after it)."""
    a = Account()
    for i, t in enumerate(trials):
        a.builds += 1
        a.search_s += t.trial_s
        s = 1.0 if i == 0 else speedup(t)  # the baseline is 1.0x by definition
        gained = s is not None and reaches_effect(s, limits.min_effect, over=a.best)
        if s is not None and s > a.best:
            a.best, a.best_route = s, t.route
        if gained:
            a.improved_at.append(i)
        if i >= start:
            a.misses = 0 if gained else a.misses + 1
    if limits.max_builds is not None and a.builds >= limits.max_builds:
        a.stop = f"the budget of {limits.max_builds} builds is spent"
    elif limits.max_search_s is not None and a.search_s >= limits.max_search_s:
        a.stop = (f"the budget of {limits.max_search_s:g} s of trials is spent "
                  f"({a.search_s:.1f} s)")
    elif a.misses >= limits.patience:
        a.stop = (f"no gain: {a.misses} proposals in a row beat the best route "
                  f"({a.best:.3f}x) by less than the minimum effect of {limits.min_effect:.0%}; "
                  f"the chance that the next one does is below {a.chance_bound():.0%} "
                  f"({CONFIDENCE:.0%} confidence)")
    return a
