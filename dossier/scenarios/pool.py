"""The sessions a scenario measured, loaded for serving: :func:`load_sessions` returns one
verified :class:`~dossier.serve.Engine` per session the shipped route's ``serving_sessions``
knob names (one when it names none). Each Engine serializes its own calls; the sessions run in
parallel when called from as many threads. The server loop (queues, threads, batching of
requests) is the user's: dossier measured it with LoadGen's (:mod:`dossier.scenarios.driver`)
and ships the count, not a server. A route's ``serving_batch`` (:func:`batch_of`) is the most
waiting queries that loop should answer with one call, their inputs concatenated along the
first axis.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from dossier.errors import BundleError
from dossier.scenario import BATCH_KNOB, BATCH_MAX, SESSIONS_KNOB

if TYPE_CHECKING:
    from dossier.serve import Engine

SESSIONS_MAX = 256
"""The most sessions a bundle's route may ask for (a route read back is untrusted)."""


def sessions_of(route: str) -> int:
    """How many sessions ``route`` serves with (its ``serving_sessions`` value; 1 without it).
    BundleError for a value that is not a count from 1 to :data:`SESSIONS_MAX`."""
    return _count(route, SESSIONS_KNOB, SESSIONS_MAX, "sessions")


def _count(route: str, knob: str, most: int, what: str) -> int:
    from dossier.routes import Route

    value = Route.parse(route).as_dict().get(knob, "1")
    if not value.isdigit() or not 1 <= int(value) <= most:
        raise BundleError(f"-{knob}={value[:40]}: not a number of {what} from 1 to {most}")
    return int(value)


def batch_of(route: str) -> int:
    """The most queries one call of ``route``'s engine answers (its ``serving_batch`` value;
    1 without it). BundleError for a value that is not a count from 1 to :data:`BATCH_MAX`."""
    return _count(route, BATCH_KNOB, BATCH_MAX, "queries per call")


def load_sessions(source: str | os.PathLike[str], **options: Any) -> list[Engine]:
    """Verify the bundle at ``source`` and load its shipped engine once per session its route
    serves with (``options``: those of :func:`dossier.load`). The first load verifies and
    reads the route; each further one is another :func:`dossier.load`."""
    from dossier import serve

    with serve.opened(source, read_validation=False, **options) as (engine, bundle):
        count = sessions_of(bundle.manifest.engines.shipped.route)
    return [engine] + [serve.load(source, **options) for _ in range(count - 1)]
