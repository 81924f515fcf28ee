"""The build plan of a search: which build each route needs, and which engine it may reuse.

A trial is a build job and a measure job. Routes whose build-time knobs have the same
effective values get the same compiler output, so they share one build: the plan maps a route
to its build key (those values), to the file name its engine is built under, to the earlier
trial whose engine it reuses (routes that differ only in load-time knobs), and to the identity
the build cache files its build under (:mod:`dossier.build_cache`). The tuner and every
scheduler (:mod:`dossier.executors`) ask the plan; none of them decides this on its own.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

from dossier.backends import Backend
from dossier.build_cache import BuildIdentity, host_identity
from dossier.fingerprint import Fingerprint, collect
from dossier.knobs import KnobDatabase, KnobPhase
from dossier.routes import Route
from dossier.run_folder import trial_name
from dossier.spec import ShapeEntry
from dossier.trial import TrialRecord

BuildKey = tuple[tuple[str, str], ...]
"""A route's effective build-time knob values, in the knob database's order: routes with the
same key share one build."""


class BuildPlan:
    """The builds of one search (see the module's documentation)."""

    def __init__(self, backend: Backend, db: KnobDatabase, *, model_digest: str,
                 builder: dict[str, Any] | None = None, shapes: Iterable[ShapeEntry] = (),
                 host: Fingerprint | None = None, calibration: str | None = None) -> None:
        """``model_digest``, ``builder`` and ``shapes``: the build inputs the build cache's
        identity names besides the route; ``host``: this host's fingerprint when the caller has
        collected it (None: collected on the first :meth:`identity`)."""
        self.backend, self.db = backend, db
        self.model_digest = model_digest
        self.builder = dict(builder or {})
        self.shapes = [e.model_dump(mode="json") for e in shapes]
        self._host: dict[str, Any] | None = host_identity(host) if host is not None else None
        self._keys: dict[str, BuildKey] = {}
        self.calibration = calibration
        """The calibration set's digest (builds of routes that need it depend on it)."""

    def key(self, route: Route) -> BuildKey:
        """``route``'s build key: the effective values of its build-time and transform knobs,
        knobs that have no effect under ``route`` (:meth:`Backend.inert_knobs`) at their
        defaults."""
        db = self.db
        inert = self.backend.inert_knobs(route, db)
        return tuple((k, db.get(k).default if k in inert else v)
                     for k, v in route.effective(db).items()
                     if db.get(k).phase is not KnobPhase.LOAD)

    def engine_name(self, index: int) -> str:
        """The engine file name of trial ``index`` (some compilers write the name into the
        engine, so a build job for that trial uses it too)."""
        return f"{trial_name(index)}{self.backend.engine_suffix}"

    def reuse(self, route: Route, trials: Iterable[TrialRecord], run_dir: Path
              ) -> TrialRecord | None:
        """An earlier trial with ``route``'s build key whose engine is in ``run_dir``: the same
        compiler output, taken instead of building (only load-time knobs differ)."""
        key = self.key(route)
        for t in trials:
            if t.role != "confirm" and t.engine and self._recorded_key(t.route) == key \
                    and (run_dir / t.engine).is_file():
                return t
        return None

    def _recorded_key(self, text: str) -> BuildKey:
        """The build key of a recorded route (parsed once: a search asks after every trial)."""
        key = self._keys.get(text)
        if key is None:
            key = self._keys[text] = self.key(Route.parse(text))
        return key

    def reused_facts(self, earlier: TrialRecord) -> dict[str, str]:
        """The build facts a trial that reuses ``earlier``'s engine records."""
        return {**earlier.extra, "reused_engine": Path(earlier.engine or "").name}

    def identity(self, route: Route) -> BuildIdentity:
        """What ``route``'s build depends on (the build cache's key)."""
        if self._host is None:
            self._host = host_identity(collect(include_compiler=self.backend.fingerprint_compiler))
        return BuildIdentity(
            backend=self.backend.name, tuner_version=self.db.tuner_version,
            stack=self.backend.stack(), host=self._host, model_digest=self.model_digest,
            builder=self.builder, shapes=self.shapes, build_knobs=sorted(self.key(route)),
            engine_suffix=self.backend.engine_suffix,
            calibration=self.calibration if self.backend.needs_calibration(route, self.db)
            else None)
