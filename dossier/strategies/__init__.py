"""Search strategies, registered by name."""

from __future__ import annotations

from typing import TYPE_CHECKING

from dossier.errors import SelectionError
from dossier.strategies.budget import BudgetStrategy
from dossier.strategies.fast import FastStrategy
from dossier.strategies.full import FullStrategy
from dossier.strategies.interface import Judged, Strategy
from dossier.strategies.mixed import MixedStrategy
from dossier.strategies.random import RandomStrategy

if TYPE_CHECKING:
    from dossier.spec import ReleaseSpec

STRATEGIES: dict[str, type[Strategy]] = {
    s.name: s for s in (FastStrategy, FullStrategy, MixedStrategy, RandomStrategy, BudgetStrategy)
}

__all__ = ["STRATEGIES", "BudgetStrategy", "FastStrategy", "FullStrategy", "Judged",
           "MixedStrategy", "RandomStrategy", "Strategy", "get_strategy"]


def get_strategy(name: str, spec: ReleaseSpec | None = None) -> Strategy:
    """The strategy called ``name``, configured from ``spec`` when given; SelectionError listing
    the known ones otherwise."""
    try:
        strategy = STRATEGIES[name]()
    except KeyError:
        raise SelectionError(f"unknown strategy {name!r}",
                             hint=f"use one of: {', '.join(STRATEGIES)}") from None
    if spec is not None:
        strategy.configure(spec)
    return strategy
