"""Search strategies, registered by name."""

from __future__ import annotations

from dossier.errors import SelectionError
from dossier.strategies.fast import FastStrategy
from dossier.strategies.full import FullStrategy
from dossier.strategies.interface import Judged, Strategy
from dossier.strategies.mixed import MixedStrategy

STRATEGIES: dict[str, type[Strategy]] = {
    s.name: s for s in (FastStrategy, FullStrategy, MixedStrategy)
}

__all__ = ["STRATEGIES", "FastStrategy", "FullStrategy", "Judged", "MixedStrategy", "Strategy",
           "get_strategy"]


def get_strategy(name: str) -> Strategy:
    """The strategy called ``name``; SelectionError listing the known ones otherwise."""
    try:
        return STRATEGIES[name]()
    except KeyError:
        raise SelectionError(f"unknown strategy {name!r}",
                             hint=f"use one of: {', '.join(STRATEGIES)}") from None
