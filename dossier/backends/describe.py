"""What the bundle writer asks of a backend, as this host registers it: the load
configuration of trials recorded before runs recorded it, and what a reviewer should see of an
engine. The bundle layer imports no backend; its callers pass this module as the writer's
``describe`` (:class:`dossier.bundle.writer.Describer`)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from dossier.backends import registry
from dossier.errors import InputError, SelectionError
from dossier.routes import Route

if TYPE_CHECKING:
    from dossier.knobs import KnobDatabase
    from dossier.load_config import LoadConfig


def recorded_load(backend: str, db: KnobDatabase, route: str
                  ) -> tuple[LoadConfig | None, dict[str, bool]]:
    """The production load configuration and engine flags of a trial recorded before the search
    recorded them (:attr:`dossier.trial.TrialRecord.load`, format 1.1): asked of ``backend``
    with its default builder options; none for a backend this host does not register."""
    try:
        impl = registry.get_backend(backend)
    except SelectionError:
        return None, {}
    parsed = Route.parse(route)
    return impl.production_load(parsed, db), dict(impl.engine_facts(parsed, db))


def engine_documents(backend: str, engine: Path) -> dict[str, bytes]:
    """What the backend reads out of an engine for a reviewer (a quantized engine's settings
    and calibration ranges); nothing when the backend is not installed here."""
    try:
        b = registry.get_backend(backend)
    except InputError:
        return {}
    return b.engine_documents(engine) if b.available() else {}
