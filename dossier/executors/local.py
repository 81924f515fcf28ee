"""The local scheduler: every job of a search in a worker process on this host.

With one build job at a time, a backend that builds in the measuring process and no build
cache, each trial is one child process that builds and measures. Otherwise builds run ahead of
measurement, in parallel (:mod:`dossier.jobs.builds`), and each trial's measure job takes its
build's engine; every running build is paused while a trial is measured.

With ``timing.trial_prestart`` (None: the backend's ``traits.prestart_measuring``), each trial's
process starts the next one's on standby as it begins (:class:`dossier.jobs.child.Child`): that one
runs its interpreter start and its runtime's imports while this one builds, loads its engines
and validates, this one starts timing only once those imports are done, and that one loads
nothing until its turn, when it is handed its final request (the next route is not known
before). A standby is started under a neutral name (``standby-N``) and takes its trial's name,
and log, at its turn. One whose environment would differ from its trial's (a reused engine's
loader environment, set at exec) is not used: it is killed and the trial starts a process of
its own. With builds apart (:mod:`dossier.jobs.builds`), the next trial's process is started so only
when its build is known to be done; otherwise (the next route is not known yet, its build still
runs, and for the first trial) it starts on standby as the wait for that build begins: the
import overlaps the build, not the trial before. A standby left unused is killed when the
search ends or fails (:meth:`LocalScheduler.drop_pending`); it dies with the search when that
is killed.
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import time
from collections.abc import Callable, Generator, Sequence
from pathlib import Path

from dossier.backends import Backend
from dossier.build_cache import BuildCache
from dossier.fingerprint import Fingerprint, collect
from dossier.jobs import forkserver, measuring
from dossier.jobs.builds import (
    COMPILE_THREADS_ENV,
    Build,
    Builds,
    default_build_jobs,
    usable_cores,
    with_build_phases,
)
from dossier.jobs.child import Child, keep_log, run_child, worker_env
from dossier.jobs.requests import CheckJob, JobRequests, TrialJob
from dossier.jobs.worker import STANDBY_WAIT_S, BuiltResult, Prebuilt, WorkerRequest, WorkerResult
from dossier.measure import confirmation
from dossier.measure.timing import TimingSettings
from dossier.routes import Route
from dossier.run_folder import trial_name

logger = logging.getLogger(__name__)


class LocalScheduler:
    """Build and measure jobs in child processes here (see the module's documentation)."""

    measures_here = True

    def __init__(self, backend: Backend, build_jobs: int | None = None,
                 cache: BuildCache | None = None) -> None:
        """``build_jobs``: concurrent builds (None: :func:`~dossier.jobs.builds.default_build_jobs`);
        ``cache``: a build cache to take engines from and store builds in."""
        self.backend = backend
        self.jobs = default_build_jobs(backend) if build_jobs is None else build_jobs
        self.cache = cache
        self.notes: list[str] = []
        self.builds: Builds | None = None
        self._requests: JobRequests | None = None
        self.standby: tuple[Child, dict[str, str]] | None = None
        """The next trial's process, started on standby, and the environment it runs in."""
        self._standbys = 0
        self._wanted: dict[int, Route] = {}

    @property
    def requests(self) -> JobRequests:
        """The search's request factory (set by :meth:`attach`)."""
        assert self._requests is not None, "attach the search first"
        return self._requests

    def fingerprint(self) -> Fingerprint:
        return collect(include_compiler=self.backend.fingerprint_compiler)

    def attach(self, requests: JobRequests) -> None:
        self._requests = requests
        requests.work.mkdir(parents=True, exist_ok=True)
        forkserver.start(self.backend.name, worker_env(), requests.work / "forkserver.log")
        if self.jobs > 1 or self.backend.traits.separate_build or self.cache is not None:
            self.builds = Builds(self.jobs, requests.work, requests.plan, self._start_build,
                                 self.cache)

    def _start_build(self, build: Build, name: str) -> Child:
        r = self.requests
        env = {}
        if self.builds is not None and self.builds.jobs > 1 and self.backend.traits.build_cores > 1:
            # builds that use several cores each: share the cores between them
            env[COMPILE_THREADS_ENV] = str(max(1, usable_cores() // self.builds.jobs))
        return Child(r.build(build.route, build.engine), r.work, name, env)

    def want(self, route: Route, index: int) -> None:
        self._wanted[index] = route
        if self.builds is not None:
            self.builds.want(route, index)

    def trial(self, route: Route, index: int, job: TrialJob,
              started: Callable[[], None]) -> tuple[WorkerResult, float]:
        req = job.req
        engine = Path(req.engine or "")
        build: Build | None = None
        env = self.backend.loader_env(Path(req.baseline_engine) if req.baseline_engine else None)
        if self.builds is not None and job.reuse is None:
            if self.standby is None and self.backend.prestarts(req.timing.trial_prestart):
                # the first trial, or one whose build was still running when the trial
                # before began: its process imports while its build is awaited
                self._stand_by(req, env)
            build = self.builds.wait(route, index)
        started()
        t0 = time.perf_counter()
        result: WorkerResult
        if build is not None and build.result is not None \
                and not isinstance(build.result, BuiltResult):
            result = build.result  # the build failed: that is the trial's outcome
            if build.child is not None:  # and its log the trial's
                keep_log(build.child.log, self.requests.work / f"{trial_name(index)}.log")
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
                result = self._run(req, index, env)
            finally:
                if self.builds is not None:
                    self.builds.resume()
            if build is not None:
                result = with_build_phases(result, build)
        return result, time.perf_counter() - t0 + (build.spent_s if build else 0.0)

    def _run(self, req: WorkerRequest, index: int, env: dict[str, str]) -> WorkerResult:
        """Run trial ``index``'s process: the one on standby when it can serve, else a fresh
        one; with prestart, the next trial's is started on standby first, unless its build
        runs apart and is not known to be done (the next route is unknown, or its build still
        runs): that process then starts as the wait for that build begins, and this trial
        need not wait for its imports."""
        name = trial_name(index)
        child = self._take(env)
        ahead = self._wanted.get(index + 1)
        if self.backend.prestarts(req.timing.trial_prestart) and (self.builds is None or (
                ahead is not None and not self.builds.pending(ahead))):
            nxt = self._stand_by(req, env)
            req = req.model_copy(update={"then": (nxt.req.stage, nxt.proc.pid)})
        if child is not None:
            child.go(req, name=name)
            result = child.wait()
            if not child.ended_on_standby():
                return result
            logger.info("%s: its process ended on standby (%s); the trial runs in a new one",
                        name, getattr(result, "reason", result.outcome))
        return run_child(req, self.requests.work, name, env)

    def _stand_by(self, req: WorkerRequest, env: dict[str, str]) -> Child:
        """Start a trial's process on standby in ``env``, its request a guess from ``req``:
        the search's setup is right, the rest (route, engines) comes with go()."""
        guess = req.model_copy(update=dict.fromkeys(
            ("route", "engine", "baseline_engine", "prebuilt", "then")))
        child = Child(guess, self.requests.work, f"standby-{self._standbys:04d}", env,
                      standby=True)
        self._standbys += 1
        self.standby = child, env
        return child

    def _take(self, env: dict[str, str]) -> Child | None:
        """The process on standby, when it still waits and runs in ``env``; else None (one
        that cannot serve is killed: a loader environment is set at exec, not later)."""
        if self.standby is None:
            return None
        (child, its_env), self.standby = self.standby, None
        if its_env == env and child.proc.poll() is None:
            return child
        if its_env != env:
            logger.debug("%s: not used (another environment); killed", child.name)
        else:
            logger.info("%s: ended on standby (%s); the trial runs in a new process",
                        child.name, _ended(child))
        child.kill()
        return None

    def _drop_standby(self) -> None:
        if self.standby is not None:
            (child, _), self.standby = self.standby, None
            child.kill()

    def measure_process(self, timing: TimingSettings,
                        env: dict[str, str]) -> confirmation.MeasureProcess:
        r = self.requests
        return measuring.local_processes(
            self.backend.name, r.validation, timing, builder=r.spec.builder,
            shapes=r.spec.shapes, work=r.work / "confirm", env=env, knobs=r.db)

    def check(self, jobs: Sequence[CheckJob]) -> Generator[WorkerResult, None, None]:
        running: list[Child] = []
        try:
            for job in jobs:
                env = self.backend.loader_env(Path(job.req.engine or ""))
                running.append(Child(job.req, self.requests.work, job.name, env))
            for child in running:
                yield child.wait()
        finally:  # a check cut short (an interrupt) leaves no process behind
            for child in running:
                if child.proc.poll() is None:
                    child.kill()

    def drop_pending(self) -> None:
        self._drop_standby()  # no trial follows: the search has ended, or failed
        if self.builds is not None:
            self.builds.close()

    def close(self) -> None:
        self.drop_pending()
        forkserver.stop()


def _ended(child: Child) -> str:
    """How a process on standby ended (killed by the trial before: not ready in time)."""
    rc = child.proc.returncode
    if rc == -signal.SIGKILL:
        return f"killed: not ready after {STANDBY_WAIT_S:g} s, or by another process"
    return f"exit status {rc}"


def _place(built: Path, engine: Path) -> None:
    """The build job's engine as the trial's (a hard link, or a copy across file systems); the
    build's file stays for other routes with the same build key."""
    engine.unlink(missing_ok=True)
    try:
        os.link(built, engine)
    except OSError:
        shutil.copyfile(built, engine)
