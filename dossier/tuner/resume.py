"""The tuning cache's header, which a search writes first, and what ``--continue`` checks
against it before a search resumes."""

from __future__ import annotations

import platform
import shutil
from pathlib import Path

from dossier.cache import CacheHeader, FileIdentity, TuningCache, lost_session
from dossier.cache_check import check_cache
from dossier.datasets import identity
from dossier.errors import CacheMismatchError
from dossier.hashing import digest_file
from dossier.routes import Route
from dossier.run_folder import CACHE_NAME, ENGINES, FINGERPRINT_NAME, KNOBS_NAME, WORK
from dossier.strategies.budget import STUDY_NAME
from dossier.tuner.prepare import Prepared
from dossier.tuner.trials import now
from dossier.version import __version__


def header(p: Prepared, spec_path: Path | None, warm_start: list[Route],
           parent: str | None) -> CacheHeader:
    """The tuning cache's header of a search of ``p``: what a resume is checked against."""
    digest, size = digest_file(p.model)
    host = {"hostname": platform.node(), "machine": platform.machine(),
            "python": platform.python_version(), **p.backend.stack()}
    spec = p.spec.resolved(model=p.model, validation=p.vset.path.resolve(),
                           selection=p.selection.text())
    return CacheHeader(
        tool_version=__version__, created_at=now(), spec=spec,
        tuner_version=p.db.tuner_version, knob_db_digest=p.db.digest(),
        model=FileIdentity(path=str(p.model), size=size, digest=digest),
        validation_digest=p.vset.digest(), validation_pairs=len(p.vset.pairs),
        inferences_per_sample=len(p.vset.timing_groups(p.spec.timing.inputs)),
        baseline_route=p.baseline.text(),
        calibration=identity("calibration", p.calibration) if p.calibration else None,
        holdout=identity("holdout", p.holdout) if p.holdout else None,
        spec_path=str(spec_path.resolve()) if spec_path else None, host=host,
        warm_start=[r.text() for r in warm_start], parent=parent)


_IDENTITY_BY_DIGEST = {"model": {"path"}, "validation": {"path"}, "calibration": {"path"},
                       "holdout": {"path"}}
"""Spec fields a resume does not compare: the model and the validation set are compared by
their digests (a moved file with the same bytes is the same input)."""


def check_resume(cache: TuningCache, fresh: CacheHeader) -> None:
    """CacheMismatchError when an input of the search changed since ``cache`` was started."""
    old = cache.header
    checks: list[tuple[str, object, object]] = [
        ("model", old.model.digest, fresh.model.digest),
        ("validation set", old.validation_digest, fresh.validation_digest),
        ("knob database", old.knob_db_digest, fresh.knob_db_digest),
        ("calibration set", old.calibration.digest if old.calibration else None,
         fresh.calibration.digest if fresh.calibration else None),
        ("hold-out set", old.holdout.digest if old.holdout else None,
         fresh.holdout.digest if fresh.holdout else None),
        ("warm start", old.warm_start, fresh.warm_start)]
    checks += _differences(old.spec.model_dump(mode="json", exclude=_IDENTITY_BY_DIGEST),
                           fresh.spec.model_dump(mode="json", exclude=_IDENTITY_BY_DIGEST))
    for what, was, is_now in checks:
        if was != is_now:
            raise CacheMismatchError(
                f"cannot continue {cache.path}: the {what} changed since the search started "
                f"({_short(was)} -> {_short(is_now)})")


def _differences(old: object, new: object, where: str = "spec") -> list[tuple[str, object, object]]:
    """Where two dumps of a spec differ: ``(dotted path, old, new)`` for each differing leaf,
    tables descended into (``spec.tune.threshold``), lists compared whole."""
    if isinstance(old, dict) and isinstance(new, dict):
        return [d for key in sorted(old.keys() | new.keys())
                for d in _differences(old.get(key), new.get(key), f"{where}.{key}")]
    return [] if old == new else [(where, old, new)]


def _short(v: object) -> str:
    s = str(v)
    return s if len(s) <= 40 else s[:37] + "..."


def reopen(out: Path, fresh: CacheHeader, p: Prepared) -> TuningCache | None:
    """The tuning cache of the search in the run folder ``out``, to continue: checked against
    ``fresh`` (the inputs as they are now) and every record against the header and the knob
    database (:mod:`dossier.cache_check`), a session killed before it wrote its record
    recorded. None when that search never got an admissible trial: what it wrote is removed,
    and the search begins again with the inputs as they are now."""
    cache = TuningCache.open(out / CACHE_NAME, repair=True)
    if not any(t.admissible for t in cache.trials):
        # a start that failed (the baseline did not pass, or was killed before it ended):
        # nothing worth keeping
        _clear_failed_start(out)
        return None
    check_resume(cache, fresh)
    check_cache(cache, p.db, out, vset=p.vset)
    lost = lost_session(cache)
    if lost is not None:  # a run killed before it wrote its own record
        cache.append(lost)
    return cache


def _clear_failed_start(out: Path) -> None:
    """Remove what a search that never got an admissible trial wrote in ``out``."""
    for name in (CACHE_NAME, KNOBS_NAME, FINGERPRINT_NAME, STUDY_NAME):
        (out / name).unlink(missing_ok=True)
    for name in (ENGINES, WORK):
        shutil.rmtree(out / name, ignore_errors=True)
