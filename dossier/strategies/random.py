"""``random``: the baseline, then routes drawn uniformly from the selection until the budget is
spent (the yardstick a budgeted search is compared against)."""

from __future__ import annotations

import math
import random
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING

from dossier.knobs import KnobDatabase
from dossier.routes import Route, Selection
from dossier.strategies.budget import build_limit
from dossier.strategies.interface import Judged, Strategy
from dossier.strategies.spend import Limits, account

if TYPE_CHECKING:
    from dossier.spec import ReleaseSpec


class RandomStrategy(Strategy):
    """Distinct uniform draws from ``seed``, within ``max_builds`` / ``max_search_s``."""

    name = "random"
    summary = "the baseline, then distinct routes drawn uniformly at random until the budget is spent"
    plans_ahead = False

    def __init__(self, limits: Limits | None = None, seed: int = 0) -> None:
        self.limits = limits or Limits()
        self.seed = seed

    def configure(self, spec: ReleaseSpec) -> None:
        """Take the budget and the seed from ``[tune]``; InputError when there is no budget."""
        build_limit(spec.tune.max_builds, spec.tune.max_search_s)
        self.limits = Limits(max_builds=spec.tune.max_builds,
                             max_search_s=spec.tune.max_search_s, patience=2**31)
        self.seed = spec.tune.seed

    def count(self, selection: Selection, db: KnobDatabase) -> int:
        """The build budget, or the size of the space when that is smaller."""
        space = math.prod(len(i.values) for i in selection.varied)
        return min(space, self.limits.max_builds) if self.limits.max_builds else space

    def plan(self, selection: Selection, db: KnobDatabase) -> list[Route]:
        """The baseline; the draws after it are not listed."""
        return [selection.baseline(db)]

    def routes(self, selection: Selection, db: KnobDatabase,
               results: Mapping[str, Judged]) -> Iterator[Route]:
        rng = random.Random(self.seed)
        base = selection.baseline(db)
        yield base
        space = math.prod(len(i.values) for i in selection.varied)
        drawn = {base.text()}
        while len(drawn) < space and \
                account(list(results.values()), self.limits, 0).stop is None:  # type: ignore[arg-type]
            route = Route.of({**base.as_dict(),
                              **{i.knob: rng.choice(i.values) for i in selection.varied}})
            if route.text() not in drawn:
                drawn.add(route.text())
                yield route
