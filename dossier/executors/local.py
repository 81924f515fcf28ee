"""The local scheduler: every job of a search in a worker process on this host.

With one build job at a time, a backend that builds in the measuring process and no build
cache, each trial is one child process that builds and measures. Otherwise builds run ahead of
measurement, in parallel (:mod:`dossier.builds`), and each trial's measure job takes its
build's engine; every running build is paused while a trial is measured.
"""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Callable
from pathlib import Path

from dossier import confirmation
from dossier.backends import Backend
from dossier.build_cache import BuildCache
from dossier.builds import (
    COMPILE_THREADS_ENV,
    Build,
    Builds,
    default_build_jobs,
    usable_cores,
    with_build_phases,
)
from dossier.child import Child, keep_log, run_child
from dossier.fingerprint import Fingerprint, collect
from dossier.job_requests import JobRequests, TrialJob
from dossier.routes import Route
from dossier.timing import TimingSettings
from dossier.worker import BuiltResult, Prebuilt, WorkerResult


class LocalScheduler:
    """Build and measure jobs in child processes here (see the module's documentation)."""

    def __init__(self, backend: Backend, build_jobs: int | None = None,
                 cache: BuildCache | None = None) -> None:
        """``build_jobs``: concurrent builds (None: :func:`~dossier.builds.default_build_jobs`);
        ``cache``: a build cache to take engines from and store builds in."""
        self.backend = backend
        self.jobs = default_build_jobs(backend) if build_jobs is None else build_jobs
        self.cache = cache
        self.notes: list[str] = []
        self.builds: Builds | None = None
        self._requests: JobRequests | None = None

    @property
    def requests(self) -> JobRequests:
        """The search's request factory (set by :meth:`attach`)."""
        assert self._requests is not None, "attach the search first"
        return self._requests

    def fingerprint(self) -> Fingerprint:
        return collect(include_compiler=self.backend.fingerprint_compiler)

    def attach(self, requests: JobRequests) -> None:
        self._requests = requests
        if self.jobs > 1 or self.backend.separate_build or self.cache is not None:
            self.builds = Builds(self.jobs, requests.work, requests.plan, self._start_build,
                                 self.cache)

    def _start_build(self, build: Build, name: str) -> Child:
        r = self.requests
        timing = r.spec.timing
        env = {}
        if self.builds is not None and self.builds.jobs > 1:  # share the cores between builds
            env[COMPILE_THREADS_ENV] = str(max(1, usable_cores() // self.builds.jobs))
        return Child(r.build(build.route, build.engine), r.work, name, timing.trial_timeout_s,
                     timing.trial_memory_limit_mb, env)

    def want(self, route: Route, index: int) -> None:
        if self.builds is not None:
            self.builds.want(route, index)

    def trial(self, route: Route, index: int, job: TrialJob,
              started: Callable[[], None]) -> tuple[WorkerResult, float]:
        req = job.req
        engine = Path(req.engine or "")
        build: Build | None = None
        if self.builds is not None and job.reuse is None:
            build = self.builds.wait(route, index)
        started()
        t0 = time.perf_counter()
        timing = req.timing
        env = self.backend.loader_env(Path(req.baseline_engine) if req.baseline_engine else None)
        result: WorkerResult
        if build is not None and build.result is not None \
                and not isinstance(build.result, BuiltResult):
            result = build.result  # the build failed: that is the trial's outcome
            if build.child is not None:  # and its log the trial's
                keep_log(build.child.log, self.requests.work / f"trial-{index:04d}.log")
        else:
            if build is not None:
                assert isinstance(build.result, BuiltResult)
                _place(build.engine, engine)
                env = {**env, **self.backend.loader_env(engine)}
                req = req.model_copy(update={"prebuilt": Prebuilt(
                    build_s=build.build_s,
                    facts={k: str(v) for k, v in build.result.facts.items()})})
            elif job.reuse is not None:  # an earlier trial's engine: the same compiler output
                engine.unlink(missing_ok=True)
                shutil.copyfile(job.reuse, engine)
                env = {**env, **self.backend.loader_env(job.reuse)}
            if self.builds is not None:
                self.builds.pause()  # nothing else runs while a trial is timed
            try:
                result = run_child(req, self.requests.work, f"trial-{index:04d}",
                                   timing.trial_timeout_s, timing.trial_memory_limit_mb, env)
            finally:
                if self.builds is not None:
                    self.builds.resume()
            if build is not None:
                result = with_build_phases(result, build)
        return result, time.perf_counter() - t0 + (build.spent_s if build else 0.0)

    def measure_process(self, timing: TimingSettings,
                        env: dict[str, str]) -> confirmation.MeasureProcess:
        r = self.requests
        return confirmation.local_processes(
            self.backend.name, r.validation, timing, builder=r.spec.builder,
            shapes=r.spec.shapes, work=r.work / "confirm", env=env, knobs=r.db)

    def drop_pending(self) -> None:
        if self.builds is not None:
            self.builds.close()

    def close(self) -> None:
        self.drop_pending()


def _place(built: Path, engine: Path) -> None:
    """The build job's engine as the trial's (a hard link, or a copy across file systems); the
    build's file stays for other routes with the same build key."""
    engine.unlink(missing_ok=True)
    try:
        os.link(built, engine)
    except OSError:
        shutil.copyfile(built, engine)
