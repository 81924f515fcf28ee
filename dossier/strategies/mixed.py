"""``mixed``: ``fast``, then ``full`` over the knobs whose one-off route helped.

Differs from trtexec on purpose: a knob is positive only when its one-off route passed the
accuracy check AND was significantly faster than the baseline (trtexec counts accuracy-failed
routes and any strictly smaller mean), and routes already measured in phase 1 are not rebuilt.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping

from dossier.errors import InputError
from dossier.knobs import KnobDatabase
from dossier.routes import Route, Selection
from dossier.strategies.fast import FastStrategy, one_offs
from dossier.strategies.full import cartesian
from dossier.strategies.interface import Judged, Strategy


class MixedStrategy(Strategy):
    """Phase 1 ``fast``; phase 2 ``full`` over the positive knobs when there are two or more."""

    name = "mixed"
    summary = ("fast, then every combination of the knobs whose one-off route passed accuracy "
               "and beat the baseline significantly")
    plans_ahead = False

    def routes(self, selection: Selection, db: KnobDatabase,
               results: Mapping[str, Judged]) -> Iterator[Route]:
        phase1 = list(FastStrategy().routes(selection, db, results))
        yield from phase1
        positive: list[str] = []
        for knob, route in one_offs(selection, db):
            r = results.get(route.text())
            if r is not None and r.admissible and r.faster and knob not in positive:
                positive.append(knob)
        if len(positive) < 2:
            return
        base = selection.baseline(db).as_dict()
        pinned = {i.knob: base[i.knob] for i in selection.items if i.knob not in positive}
        seen = {r.text() for r in phase1}
        for route in cartesian(selection, pinned):
            if route.text() not in seen:
                seen.add(route.text())
                yield route

    def ahead(self, selection: Selection, db: KnobDatabase,
              results: Mapping[str, Judged]) -> list[Route]:
        """Phase 1; phase 2 too once every phase-1 route is measured (it decides phase 2)."""
        phase1 = list(FastStrategy().routes(selection, db, results))
        if all(r.text() in results for r in phase1):
            return list(self.routes(selection, db, results))
        return phase1

    def plan(self, selection: Selection, db: KnobDatabase) -> list[Route]:
        """Refused: phase 2 depends on measured results."""
        raise InputError("--dry-run cannot list the routes of strategy 'mixed': its second "
                         "phase depends on measured results",
                         hint="dry-run the fast phase with --strategy fast")

    def count(self, selection: Selection, db: KnobDatabase) -> int:
        """Upper bound: phase 1 plus every combination not already in phase 1."""
        fast = FastStrategy().count(selection, db)
        full = 1
        for item in selection.varied:
            full *= len(item.values)
        return fast + full
