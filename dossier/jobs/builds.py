"""Build jobs of a search, run ahead of measurement and in parallel.

A trial is a build job and a measure job. Builds of different routes run concurrently, up to
``jobs`` at a time, each in its own worker process writing its engine under the run's work
folder; measurement stays one trial at a time, in the strategy's order, and every running build
is paused (SIGSTOP to its process group) while a trial is measured, so builds never share the
machine with a timing. Routes with the same build key (:mod:`dossier.build_plan`) share one
build. Nothing a build
job produces is recorded until its route is measured: a search killed with builds in flight
rebuilds them when it continues.

With a build cache (:mod:`dossier.build_cache`), a build job whose identity is stored takes the
stored engine instead of building, and every finished build is stored.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from dossier.backends import Backend
from dossier.build_cache import BuildCache
from dossier.build_plan import BuildKey, BuildPlan
from dossier.jobs.child import Child
from dossier.jobs.worker import BuiltResult, MeasuredResult, WorkerResult
from dossier.routes import Route

logger = logging.getLogger(__name__)

COMPILE_THREADS_ENV = "TORCHINDUCTOR_COMPILE_THREADS"
"""Set for each build when several run at once: the cores shared out between them."""
MAX_DEFAULT_JOBS = 8
POLL_S = 0.05


def usable_cores() -> int:
    """CPU cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def _available_mb() -> int | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) // 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def default_build_jobs(backend: Backend) -> int:
    """Concurrent builds by default: the cores over what one build of this backend keeps busy,
    bounded by the memory available over what one build needs, at most 8; 1 for a backend
    whose ``build_cores`` is 0 (quick builds, or builds that time kernels on the device)."""
    if backend.traits.build_cores <= 0:
        return 1
    jobs = usable_cores() // backend.traits.build_cores
    mem = _available_mb()
    if mem is not None and backend.traits.build_memory_mb:
        jobs = min(jobs, mem // backend.traits.build_memory_mb)
    return max(1, min(jobs, MAX_DEFAULT_JOBS))


@dataclass
class Build:
    """One build job (shared by the routes with the same build key)."""

    key: BuildKey | None
    route: Route
    engine: Path
    child: Child | None = None
    result: WorkerResult | None = None
    paused: list[tuple[float, float]] = field(default_factory=list)
    """(start, end) of every pause, time.time(), to subtract from the reported build time."""
    cached: bool = False
    """The engine came from the build cache: ``build_s`` is the time it took when it was
    built, ``spent_s`` the time taken here (the copy)."""

    @property
    def build_s(self) -> float | None:
        """Build time without the paused spans."""
        r = self.result
        if r is None or isinstance(r, MeasuredResult) or r.build_s is None:
            return None
        if not isinstance(r, BuiltResult):
            return r.build_s
        lost = sum(max(0.0, min(b, r.ended_at) - max(a, r.started_at)) for a, b in self.paused)
        return max(0.0, r.build_s - lost)

    @property
    def spent_s(self) -> float:
        """Time this search spent on the build (the copy, for an engine from the cache)."""
        if self.cached and self.result is not None:
            return self.result.phases_s.get("build", 0.0)
        return self.build_s or 0.0


class Builds:
    """The build queue of one search."""

    def __init__(self, jobs: int, work: Path, plan: BuildPlan,
                 start: Callable[[Build, str], Child], cache: BuildCache | None = None) -> None:
        """``plan``: the search's builds (their keys, engine names and build-cache
        identities); ``start``: starts a build job's process; ``cache``: take stored engines
        and store finished builds."""
        self.jobs = max(1, jobs)
        self.cache = cache
        self.plan = plan
        self.folder = work / "builds"
        self.folder.mkdir(parents=True, exist_ok=True)
        self._start = start
        self._by_key: dict[BuildKey, Build] = {}
        self._queue: list[Build] = []
        self._running: list[Build] = []
        self._paused_at: float | None = None

    def want(self, route: Route, index: int) -> None:
        """Queue ``route``'s build unless one with its build key exists. ``index`` is the
        trial index the route will be measured as: the engine is built under the trial's file
        name (:meth:`BuildPlan.engine_name`)."""
        key = self.plan.key(route)
        if key in self._by_key:
            return
        n = len(self._by_key)
        build = Build(key, route, self.folder / f"build-{n:04d}" / self.plan.engine_name(index))
        build.engine.parent.mkdir(parents=True, exist_ok=True)
        self._by_key[key] = build
        if not self._from_cache(build):
            self._queue.append(build)
        self.pump()

    def _from_cache(self, build: Build) -> bool:
        if self.cache is None:
            return False
        t0 = time.perf_counter()
        entry = self.cache.get(self.plan.identity(build.route), build.engine)
        if entry is None:
            return False
        build.cached = True
        build.result = BuiltResult(outcome="built", build_s=entry.build_s,
                                   facts={**entry.facts, "build_cache": "hit"},
                                   phases_s={"build": time.perf_counter() - t0})
        return True

    def _store(self, build: Build) -> None:
        if self.cache is None or build.cached \
                or not isinstance(build.result, BuiltResult) or not build.engine.is_file():
            return
        self.cache.put(self.plan.identity(build.route), build.engine, build.build_s or 0.0,
                       build.result.facts)

    def pump(self) -> None:
        """Collect finished builds and start queued ones while slots are free."""
        for b in list(self._running):
            assert b.child is not None
            b.result = b.child.poll()
            if b.result is not None:
                self._running.remove(b)
                logger.info("build of %s ended %s; its log: %s", b.route, b.result.outcome,
                            b.child.log)
                self._store(b)
        while self._queue and len(self._running) < self.jobs and self._paused_at is None:
            b = self._queue.pop(0)
            b.child = self._start(b, b.engine.parent.name)
            logger.debug("build of %s started; its log: %s", b.route, b.child.log)
            self._running.append(b)

    def pending(self, route: Route) -> bool:
        """Whether ``route``'s build is wanted and not yet finished (as of the last pump)."""
        build = self._by_key.get(self.plan.key(route))
        return build is not None and build.result is None

    def wait(self, route: Route, index: int) -> Build:
        """``route``'s finished build (queued and started first if needed)."""
        self.want(route, index)
        build = self._by_key[self.plan.key(route)]
        if build in self._queue:  # measurement waits for it: it goes first
            self._queue.remove(build)
            self._queue.insert(0, build)
        try:
            while build.result is None:
                self.pump()
                if build.result is None:
                    time.sleep(POLL_S)
        except BaseException:
            self.close()
            raise
        return build

    def pause(self) -> None:
        """Stop every running build (a trial is about to be measured)."""
        self.pump()
        self._paused_at = time.time()
        for b in self._running:
            assert b.child is not None
            b.child.pause()

    def resume(self) -> None:
        """Let the paused builds go on, and start queued ones."""
        if self._paused_at is None:
            return
        now = time.time()
        for b in self._running:
            assert b.child is not None
            b.child.resume()
            b.paused.append((self._paused_at, now))
        self._paused_at = None
        self.pump()

    def close(self) -> None:
        """Kill every running build (the search ends or failed)."""
        for b in self._running:
            assert b.child is not None
            b.child.kill()
        self._running.clear()
        self._queue.clear()


def with_build_phases(result: WorkerResult, build: Build) -> WorkerResult:
    """The measure job's phases with the build job's (``*_build``, and ``build``) in front."""
    done = build.result.phases_s if build.result is not None else {}
    phases = {**{f"{k}_build": v for k, v in done.items() if k != "build"},
              "build": build.spent_s if build.cached
              else build.build_s if build.build_s is not None else done.get("build", 0.0),
              **{k: v for k, v in result.phases_s.items() if k != "build"}}
    return result.model_copy(update={"phases_s": phases})
