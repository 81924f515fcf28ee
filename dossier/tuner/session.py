"""One session of a search over its run folder: the folder locked, the search started or
resumed, its scheduler opened, its processes placed (and a shared target's co-tenant load
started), the session recorded; and ``--continue``."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

from dossier.build_cache import open_build_cache
from dossier.cache import DecisionRecord, SessionRecord, TuningCache
from dossier.diskfull import disk_full_error, is_disk_full
from dossier.errors import InputError, OutputError
from dossier.executors import Scheduler, open_scheduler
from dossier.files import replace_small
from dossier.fingerprint import Fingerprint, collect
from dossier.jobs.child import clear_work
from dossier.jobs.cotenants import cotenants
from dossier.jobs.placement import placed
from dossier.lock import RUN_LOCK, new_or_locked_run_folder
from dossier.routes import Route
from dossier.run_folder import CACHE_NAME, FINGERPRINT_NAME, KNOBS_NAME, trial_name
from dossier.spec import ReleaseSpec
from dossier.tuner.observer import TuneObserver
from dossier.tuner.prepare import prepare
from dossier.tuner.resume import header, reopen
from dossier.tuner.search import Tuner
from dossier.tuner.trials import now

COTENANT_MAX_S = 24 * 3600.0
"""The longest a shared target's co-tenant load runs (:mod:`dossier.jobs.cotenants`; it also
dies with the search)."""


@dataclass
class TuneResult:
    """A finished search."""

    run_dir: Path
    cache: TuningCache
    decision: DecisionRecord
    trials_run: int = 0
    notes: list[str] = field(default_factory=list)


def tune(spec: ReleaseSpec, out: Path, *, observer: TuneObserver | None = None,
         spec_path: Path | None = None, resume: bool = False,
         warm_start: list[str] | None = None, parent: str | None = None,
         build_jobs: int | None = None, executor: str = "local",
         address: str | None = None, build_cache: str | Path | None = None) -> TuneResult:
    """Search ``spec``'s selection and decide, writing everything under ``out``.

    ``out`` must not hold a search yet unless ``resume``; with ``resume`` the cache there is
    checked against the spec's inputs (model, validation set, knob database, selection...) and
    every record against the header and the knob database (:mod:`dossier.cache_check`), and
    the search continues. ``warm_start`` routes are measured first, right after the baseline
    (routes the selection does not allow are refused); ``parent`` is recorded in the header.
    ``build_jobs`` builds run at once (None: from the cores; see :mod:`dossier.jobs.builds`); the
    results do not depend on it, only the wall time does. ``executor`` ``"ray"`` runs build and
    measure jobs on the Ray cluster at ``address`` (see :mod:`dossier.executors`).
    ``build_cache``: a folder of engines kept across searches (:mod:`dossier.build_cache`;
    None: the folder ``DOSSIER_BUILD_CACHE`` names, if set); local builds only.
    The run folder is locked for the whole search (BusyError when another process holds it);
    a full disk stops it with DiskFullError, recording nothing false.
    """
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise OutputError(f"--out {out} is a file, not a folder",
                          hint="give a folder for the run (it is created when missing)")
    with new_or_locked_run_folder(out):
        return _tune(spec, out, observer=observer, spec_path=spec_path, resume=resume,
                     warm_start=warm_start, parent=parent, build_jobs=build_jobs,
                     executor=executor, address=address, build_cache=build_cache)


def _tune(spec: ReleaseSpec, out: Path, *, observer: TuneObserver | None = None,
          spec_path: Path | None = None, resume: bool = False,
          warm_start: list[str] | None = None, parent: str | None = None,
          build_jobs: int | None = None, executor: str = "local",
          address: str | None = None, build_cache: str | Path | None = None) -> TuneResult:
    """The search itself, under the run folder's lock (see :func:`tune`)."""
    p = prepare(spec)
    if build_jobs is not None and build_jobs < 1:
        raise InputError(f"--build-jobs must be at least 1 (got {build_jobs})")
    store = open_build_cache(build_cache)
    if store is not None and executor != "local":
        raise InputError(f"--build-cache works with local builds only, not --executor {executor}",
                         hint="leave out --build-cache (or unset DOSSIER_BUILD_CACHE)")
    warm = [Route.parse(text, p.db) for text in (warm_start or [])]
    fresh = header(p, spec_path, warm, parent)
    cache = reopen(out, fresh, p) if resume else None
    if cache is None and out.exists() and any(e.name != RUN_LOCK for e in out.iterdir()):
        raise OutputError(f"output folder {out} is not empty",
                          hint="choose a new --out, or --continue the search that is there")
    # before any file: a cluster that refuses writes none
    ex = open_scheduler(executor, address, p.backend, p.model, p.vset.path)
    try:
        if cache is None:
            out.mkdir(parents=True, exist_ok=True)
            cache = TuningCache.create(out / CACHE_NAME, fresh)
        # written after the header: a kill in between leaves them to --continue (the knob
        # database matches the header's digest; the fingerprint is of the host tuning now)
        if not (out / KNOBS_NAME).is_file():
            _write_json(out / KNOBS_NAME, p.db.model_dump_json(indent=2))
        here: Fingerprint | None = None  # this host's, when collected now
        if not (out / FINGERPRINT_NAME).is_file():  # of the host that measures
            if ex is None:
                here = fp = collect(include_compiler=p.backend.fingerprint_compiler)
            else:
                fp = ex.fingerprint()
            _write_json(out / FINGERPRINT_NAME, fp.model_dump_json(indent=2))
    except OSError as exc:
        _close(ex)
        if is_disk_full(exc):
            raise disk_full_error(exc, out, "writing the run folder") from exc
        raise OutputError(f"cannot write to {out}: {exc.strerror}") from exc
    started, t0 = now(), time.perf_counter()
    target = p.spec.target
    # pinned (and, for a dedicated target, ahead of other work) before any worker starts:
    # every process of the search inherits it (dossier.jobs.placement)
    with placed(target) as where:
        tuner = Tuner(p, out, cache, observer, warm, build_jobs, ex, store, here)
        try:
            with cotenants(target.co_tenants, where.cores, COTENANT_MAX_S):
                decision = tuner.search()
        except KeyboardInterrupt:
            cache.append(SessionRecord(started_at=started, wall_s=time.perf_counter() - t0,
                                       trials_run=tuner.ran, interrupted=True))
            raise
        finally:
            _close(tuner.scheduler)  # the given executor, or the tuner's own
    cache.append(SessionRecord(started_at=started, wall_s=time.perf_counter() - t0,
                               trials_run=tuner.ran, interrupted=False))
    if p.spec.scenario.loadgen:  # the serving configurations compete under the scenario
        from dossier.scenarios.release import after_search
        decision = after_search(cache, decision, out, p.db, p.spec.scenario,
                                backend=p.backend.name, timing=p.spec.timing)
    clear_work(tuner.work, [trial_name(t.index) for t in cache.trials if not t.admissible])
    notes = list(ex.notes) if ex is not None else []
    notes += where.notes + p.strategy.notes()
    if store is not None:
        notes += [*store.notes, f"build cache {store.folder}: {store.hits} engine(s) taken, "
                  f"{store.stored} stored"]
    return TuneResult(out, cache, decision, tuner.ran, notes)


def _close(ex: Scheduler | None) -> None:
    if ex is not None:
        ex.close()


def _write_json(path: Path, text: str) -> None:
    replace_small(path, (text + "\n").encode("utf-8"))  # a full disk leaves no knobs.json.tmp


def continue_tune(cache_path: Path, *, observer: TuneObserver | None = None,
                  build_jobs: int | None = None, executor: str = "local",
                  address: str | None = None, build_cache: str | Path | None = None
                  ) -> TuneResult:
    """Resume the search recorded in ``cache_path`` (its folder is the run folder)."""
    cache_path = Path(cache_path)
    if cache_path.is_dir():
        cache_path = cache_path / CACHE_NAME
    cache = TuningCache.open(cache_path)
    spec = cache.header.spec
    path = Path(cache.header.spec_path) if cache.header.spec_path else None
    return tune(spec, cache_path.parent, observer=observer, spec_path=path, resume=True,
                warm_start=cache.header.warm_start, parent=cache.header.parent,
                build_jobs=build_jobs, executor=executor, address=address,
                build_cache=build_cache)
