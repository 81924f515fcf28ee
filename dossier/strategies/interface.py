"""The strategy interface: how routes are drawn from a selection."""

from __future__ import annotations

import abc
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar, Protocol

from dossier.knobs import KnobDatabase
from dossier.routes import Route, Selection

if TYPE_CHECKING:
    from dossier.spec import ReleaseSpec


class Judged(Protocol):
    """What a strategy may know about a finished trial."""

    @property
    def admissible(self) -> bool:
        """Built, ran, and passed the accuracy check."""

    @property
    def faster(self) -> bool:
        """Significantly faster than the baseline (by the timing rule in force)."""


class Strategy(abc.ABC):
    """Draws routes from a selection, possibly looking at results so far."""

    name: ClassVar[str]
    summary: ClassVar[str]
    plans_ahead: ClassVar[bool] = True
    """False when the routes depend on results (then ``--dry-run`` cannot list them)."""

    def configure(self, spec: ReleaseSpec) -> None:
        """Take the strategy's settings from the spec (a budget, a seed); none by default."""

    def open(self, run_dir: Path | None) -> None:
        """Keep what the strategy must remember across ``tune --continue`` in ``run_dir``
        (None: nowhere); nothing by default."""

    def notes(self) -> list[str]:
        """What the last walk has to say (why it stopped early); nothing by default."""
        return []

    @abc.abstractmethod
    def routes(self, selection: Selection, db: KnobDatabase,
               results: Mapping[str, Judged]) -> Iterator[Route]:
        """Yield routes in order. ``results`` (keyed by route text) is updated by the caller
        between yields; a route already in it is not run again."""

    def ahead(self, selection: Selection, db: KnobDatabase,
              results: Mapping[str, Judged]) -> list[Route]:
        """The routes known to come whatever is measured next, given ``results`` (their builds
        may start now): every route for a strategy that plans ahead, none otherwise."""
        return self.plan(selection, db) if self.plans_ahead else []

    def plan(self, selection: Selection, db: KnobDatabase) -> list[Route]:
        """Every route in order, without running anything (``--dry-run``)."""
        return list(self.routes(selection, db, {}))

    def count(self, selection: Selection, db: KnobDatabase) -> int:
        """How many routes the strategy draws (an upper bound when it depends on results)."""
        return len(self.plan(selection, db))
