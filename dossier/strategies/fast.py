"""``fast``: the baseline, then one knob at a time (trtexec's default search)."""

from __future__ import annotations

from collections.abc import Iterator, Mapping

from dossier.knobs import KnobDatabase
from dossier.routes import Route, Selection
from dossier.strategies.interface import Judged, Strategy


def one_offs(selection: Selection, db: KnobDatabase) -> Iterator[tuple[str, Route]]:
    """(knob, route) for every one-knob variation of the baseline, as trtexec orders them: varied
    knobs right to left, each knob's listed values in order, the default value skipped."""
    base = selection.baseline(db).as_dict()
    for item in reversed(selection.varied):
        default = db.get(item.knob).default
        for value in item.values:
            if value != default:
                yield item.knob, Route.of({**base, item.knob: value})


class FastStrategy(Strategy):
    """``1 + sum(listed values != default)`` routes."""

    name = "fast"
    summary = "the baseline, then each varied knob's other values one at a time (right to left)"

    def routes(self, selection: Selection, db: KnobDatabase,
               results: Mapping[str, Judged]) -> Iterator[Route]:
        yield selection.baseline(db)
        for _, route in one_offs(selection, db):
            yield route
