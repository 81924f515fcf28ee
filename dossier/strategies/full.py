"""``full``: the Cartesian product of the varied knobs (trtexec kEXHAUSTIVE)."""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Mapping

from dossier.knobs import KnobDatabase
from dossier.routes import Route, Selection
from dossier.strategies.interface import Judged, Strategy


def cartesian(selection: Selection, pinned: Mapping[str, str] | None = None) -> Iterator[Route]:
    """Every combination of the listed values, last knob changing fastest (trtexec's mixed-radix
    order); knobs in ``pinned`` are held at the given value instead."""
    pinned = dict(pinned or {})
    axes = [[(i.knob, v) for v in ([pinned[i.knob]] if i.knob in pinned else i.values)]
            for i in selection.items]
    for combo in itertools.product(*axes):
        yield Route.of(combo)


class FullStrategy(Strategy):
    """All ``prod(n_i)`` routes."""

    name = "full"
    summary = "every combination of the listed values (prod of list lengths), last knob fastest"

    def routes(self, selection: Selection, db: KnobDatabase,
               results: Mapping[str, Judged]) -> Iterator[Route]:
        yield from cartesian(selection)
