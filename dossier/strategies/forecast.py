"""What a budget buys, before a search runs (``tune --dry-run`` of ``random`` and ``budget``).

The builds: the build budget, the structured start within it, and the size of the space. The
wall time: builds x the baseline's build time, taken from the build cache when it holds the
baseline's engine (its entry records how long the build took), else from one build of the
baseline made now in a temporary folder. A trial also loads, validates and times its engine
against the baseline's, which the estimate leaves out (it is the same for every strategy: about
``rounds x samples`` runs of two engines per trial).
"""

from __future__ import annotations

import math
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from dossier.backends import Backend
from dossier.build_cache import open_build_cache
from dossier.build_plan import BuildPlan
from dossier.hashing import digest_file
from dossier.knobs import KnobDatabase
from dossier.routes import Selection
from dossier.spec import ReleaseSpec
from dossier.strategies.interface import Strategy


@dataclass(frozen=True)
class Forecast:
    """What a budgeted search's budget buys."""

    strategy: str
    """random or budget."""
    space: int
    """Routes in the selection."""
    start: int
    """Routes of the structured start (the baseline and the one-knob routes; random: 1)."""
    builds: int
    """Routes the build budget buys at most (the space when there is no build budget)."""
    max_search_s: float | None
    """The time budget, if any."""
    build_s: float | None
    """The baseline's build time (None: unknown)."""
    build_source: Literal["build cache", "a first build"] | None
    """Where ``build_s`` comes from."""
    ascends: bool = False
    """The structured start is an ascent (a build budget under twice the start:
    :func:`dossier.strategies.budget.ascends`)."""

    @property
    def builds_s(self) -> float | None:
        """Expected wall time of the builds: builds x build_s."""
        return self.builds * self.build_s if self.build_s is not None else None

    def lines(self) -> list[str]:
        """The forecast for people."""
        out = [f"strategy {self.strategy}: {self.space} routes in the selection; the budget "
               f"buys {self.builds} builds" + (f" or {self.max_search_s:g} s of trials, "
                                               "whichever ends first" if self.max_search_s else "")]
        if self.strategy == "budget":
            first = min(self.start, self.builds)
            how = ("the baseline, then each knob's values tried from the best route so far: "
                   "the budget is under twice the start" if self.ascends
                   else "the baseline and one-knob routes")
            out.append(f"structured start: {first} of {self.start} routes ({how}); then up to "
                       f"{max(0, self.builds - first)} proposals")
            if self.start > self.builds:
                out.append("the build budget ends inside the structured start: raise "
                           "max_builds to let the model propose anything")
        if self.build_s is not None:
            out.append(f"one build takes {self.build_s:.2f} s ({self.build_source}): "
                       f"{self.builds} builds about {self.builds_s:.1f} s, plus each trial's "
                       "validation and timing")
        return out


def forecast(spec: ReleaseSpec, strategy: Strategy, selection: Selection, db: KnobDatabase,
             backend: Backend, model: Path, build_cache: str | Path | None = None) -> Forecast:
    """The forecast of ``spec``'s search, as the tuner prepared it (its strategy ``random`` or
    ``budget``). Builds the baseline once in a temporary folder unless the build cache holds
    it."""
    from dossier.strategies.budget import BudgetStrategy

    space = math.prod(len(i.values) for i in selection.varied)
    start = len(strategy.start(selection, db)) if isinstance(strategy, BudgetStrategy) else 1
    max_builds = spec.tune.max_builds
    builds = min(space, max_builds) if max_builds else space
    baseline = selection.baseline(db)
    with tempfile.TemporaryDirectory(prefix="dossier-forecast-") as tmp:
        engine = Path(tmp) / f"baseline{backend.engine_suffix}"
        store = open_build_cache(build_cache)
        entry = None
        if store is not None:
            plan = BuildPlan(backend, db, model_digest=digest_file(model)[0],
                             builder=spec.builder, shapes=spec.shapes)
            entry = store.get(plan.identity(baseline), engine)
        if entry is not None:
            build_s: float = entry.build_s
            source: Literal["build cache", "a first build"] = "build cache"
        else:
            t0 = time.perf_counter()
            backend.build(model, baseline, engine)
            build_s, source = time.perf_counter() - t0, "a first build"
    ascending = isinstance(strategy, BudgetStrategy) and strategy.ascends(selection, db)
    return Forecast(spec.tune.strategy, space, start, builds, spec.tune.max_search_s, build_s,
                    source, ascending)
