"""The Ray scheduler: one search over the CPUs and GPUs of a Ray cluster.

- **Build jobs** are Ray tasks (the backend's build cores each, as many at once as the
  cluster's CPUs allow; ``--build-jobs`` does not apply), run through the same worker code as
  locally (a child process per build, :func:`dossier.jobs.child.run_child`).
  A task whose worker dies is retried once by Ray; a second death records the trial ``crashed``.
- **Measure jobs** run on measure workers: one actor per GPU of the cluster (``num_gpus=1``), or
  one actor with a CPU on a cluster without GPUs. Each measure job is a fresh child process on
  the actor's device that builds nothing, loads the candidate and the baseline engine (kept on
  the actor's node, fetched once) and times them interleaved: the same
  :func:`dossier.jobs.worker.run_trial` as the local executor, so every speedup is a paired ratio of
  one device. The statistics are computed by the driver from the raw samples, as locally.
- **Engines travel** through the object store: build task -> measure actor directly, and an
  ``ok`` trial's engine back to the driver for the run folder (and the bundle). Every arrival
  is checked against the digest computed where the file was written.
- **One writer**: the driver appends each trial to the tuning cache in trial order. Measure jobs
  run ahead, on every free worker, once the baseline trial is recorded; a driver killed with
  jobs in flight loses only them (``--continue`` runs them again).
- **Hold-out checks** run on the measure workers too: the hold-out set travels through the
  object store once, as the model and validation set do, the engine as a measure job's does.
- **Worker loss**: a measure worker that dies during a trial is replaced and the trial re-queued
  once; a trial whose worker dies again is recorded ``crashed``, never retried forever.
- **Fingerprints**: every measure worker reports its GPU model, driver, CUDA runtime, compiler
  and backend versions; one that differs from the run's is refused with one line (a note of the
  run) and gets no trial.

Each trial records the node, host and GPU that measured it in its extra facts (``worker_*``).
"""

from __future__ import annotations

import contextlib
import os
import socket
import time
from collections.abc import Callable, Generator, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dossier.backends.interface import first_line
from dossier.errors import InputError, TuneError
from dossier.executors.ray_workers import (
    MeasureWorker,
    build_task,
    folder_files,
    mismatch,
    ray_module,
    stack_facts,
    write_checked,
)
from dossier.fingerprint import Fingerprint, collect
from dossier.hashing import digest_bytes, digest_file
from dossier.jobs.builds import Build, with_build_phases
from dossier.jobs.worker import (
    RESULT,
    BuiltResult,
    FailedResult,
    Prebuilt,
    WorkerRequest,
    WorkerResult,
)
from dossier.routes import Route

if TYPE_CHECKING:
    from ray import ObjectRef

    from dossier.backends import Backend
    from dossier.build_plan import BuildKey
    from dossier.jobs.requests import CheckJob, JobRequests, TrialJob
    from dossier.measure.confirmation import MeasureProcess
    from dossier.measure.timing import TimingSettings

ATTEMPTS = 2
"""Runs of one trial at most when its worker dies: re-queued once, then recorded crashed."""
WAIT_S = 0.2
CONNECT_S = 10.0
"""Seconds to wait for the cluster's address to answer before giving up."""
START_S = 300.0
"""Seconds a new measure worker may take to start (placement, imports, inputs)."""
CLOSE_S = 30.0
"""Seconds a measure worker may take to remove its folder when the search ends."""
# --------------------------------------------------------------------------------- the driver
@dataclass
class _Worker:
    handle: Any
    hello: dict[str, Any]
    job: _Job | None = None
    count: int = 0
    """Jobs sent to it (work goes to the free worker with the fewest)."""


@dataclass
class _Build:
    meta: Any
    """ObjectRef of (result JSON, digest)."""
    data: Any
    """ObjectRef of the engine's bytes."""
    result: WorkerResult | None = None
    digest: str | None = None


@dataclass
class _Job:
    route: Route
    index: int
    trial: TrialJob
    role: str
    build: _Build | None
    after: int | None = None
    """An earlier trial with the same build-time knobs: this one waits until it is recorded."""
    attempts: int = 0
    mode: str = "none"
    """How the engine reached the measure worker: ``built``, ``reuse`` or ``none``."""
    ref: Any = None
    out: tuple[WorkerResult, bytes | None, str | None, float] | None = None
    stale: bool = False


class RayScheduler:
    """Build tasks and measure actors on a Ray cluster, for one search."""

    measures_here = False

    def __init__(self, ray: Any, backend: Backend, model: Path, validation: Path,
                 started: bool) -> None:
        self.ray, self.backend, self.started = ray, backend, started
        self.model, self.validation = Path(model), Path(validation)
        self.notes: list[str] = []
        self._requests: JobRequests | None = None
        self._builds: dict[BuildKey, _Build] = {}
        self._jobs: dict[tuple[str, int], _Job] = {}
        self._wanted: dict[tuple[str, int], Route] = {}
        self._workers: list[_Worker] = []
        self._blobs: dict[Path, tuple[str, Any]] = {}
        self._sets: dict[Path, Any] = {}
        """The data sets of check jobs, packed (:meth:`_pack`) once each."""
        self._inputs = self._pack_inputs()
        self._compiler = backend.fingerprint_compiler
        # the run's facts: the driver's where it knows them (its GPU, if any, is not used),
        # the first measure worker's for the rest
        self._reference = stack_facts(collect(include_gpu=False, include_compiler=self._compiler),
                                      None, backend.stack())
        resources = ray.cluster_resources()
        gpus = resources.get("GPU", 0)
        # one CPU stays with the measure worker on a cluster without GPUs
        spare = int(resources.get("CPU", 1)) - (0 if gpus >= 1 else 1)
        self._build_cpus = max(1, min(backend.traits.build_cores, spare))
        self._options: dict[str, Any] = ({"num_gpus": 1, "num_cpus": 0} if gpus >= 1
                                         else {"num_cpus": 1})
        self._fp: Fingerprint | None = None
        for _ in range(max(1, int(gpus))):
            self._add_worker()
        if not self._workers:
            raise TuneError("no measure worker of the Ray cluster matches this run: "
                            + "; ".join(self.notes))

    @classmethod
    def open(cls, address: str | None, backend: Backend, model: Path,
             validation: Path) -> RayScheduler:
        """Connect to the cluster at ``address`` (None: a Ray instance already started in this
        process, else a new local one) and start one measure worker per GPU, each given the
        model and the validation set."""
        ray = ray_module()
        started = False
        if not ray.is_initialized():
            _check_reachable(address)
            try:
                with _neutral_cwd():
                    ray.init(address=address, include_dashboard=False, logging_level="ERROR",
                             log_to_driver=False)
            except (ConnectionError, RuntimeError, ValueError) as exc:
                where = address or "a new local instance"
                raise TuneError(f"cannot connect to the Ray cluster at {where}: "
                                f"{first_line(exc)}") from exc
            started = True
        try:
            return cls(ray, backend, model, validation, started)
        except BaseException:
            if started:
                ray.shutdown()
            raise

    def _pack_inputs(self) -> ObjectRef[dict[str, Any]]:
        """The model and validation set, in Ray's object store once for every actor."""
        model = self.model
        files = {model.name: (digest_file(model)[0], model.read_bytes()),
                 **folder_files(self.validation, "validation")}
        return self._pack(files, model=model.name, validation="validation")

    def _pack(self, files: dict[str, tuple[str, bytes]], **names: str
              ) -> ObjectRef[dict[str, Any]]:
        """``files`` (relative path -> digest, bytes) in Ray's object store, keyed by their
        digests (:func:`~dossier.executors.ray_workers.materialize` writes them once per
        node), with ``names``."""
        key = digest_bytes("\n".join(f"{k}={d}" for k, (d, _) in files.items()).encode())
        ref: ObjectRef[dict[str, Any]] = self.ray.put({"key": key, "files": files, **names})
        return ref

    def _add_worker(self) -> None:
        ray = self.ray
        cls = ray.remote(MeasureWorker).options(max_restarts=0, max_concurrency=1,
                                                **self._options)
        handle = cls.remote(self._inputs, self.backend.name, self._compiler)
        try:
            hello = ray.get(handle.hello.remote(), timeout=START_S)
        except ray.exceptions.GetTimeoutError:
            self.notes.append(f"a measure worker did not start within {START_S:g} s")
            ray.kill(handle)
            return
        except ray.exceptions.RayError as exc:
            self.notes.append(f"a measure worker failed to start: {first_line(exc)}")
            return
        facts = hello["facts"]
        if self._fp is None:
            self._reference = {k: self._reference.get(k) if self._reference.get(k) is not None
                               else facts.get(k) for k in {**facts, **self._reference}}
        why = mismatch(self._reference, facts)
        where = hello["where"]
        if why is not None:
            self.notes.append(f"refused measure worker {where['worker_host']} GPU "
                              f"{where['worker_gpu']}: its {why}")
            _close(ray, handle)
            return
        if self._fp is None:
            self._fp = Fingerprint.model_validate_json(hello["fingerprint"])
        self._workers.append(_Worker(handle, hello))

    def fingerprint(self) -> Fingerprint:
        assert self._fp is not None
        return self._fp

    @property
    def requests(self) -> JobRequests:
        """The search's request factory (set by :meth:`attach`)."""
        assert self._requests is not None, "attach the search first"
        return self._requests

    def attach(self, requests: JobRequests) -> None:
        self._requests = requests

    # -- jobs
    def _build(self, route: Route, index: int) -> _Build | None:
        """``route``'s build job, started unless one with its build key was (None where
        builds time kernels on the device: the measure job builds on its GPU)."""
        if self.backend.traits.build_cores <= 0:
            return None
        plan = self.requests.plan
        key = plan.key(route)
        b = self._builds.get(key)
        if b is None:
            req = self.requests.build(route, Path(plan.engine_name(index)))
            task = self.ray.remote(build_task).options(num_cpus=self._build_cpus,
                                                       max_retries=ATTEMPTS - 1, num_returns=2)
            meta, data = task.remote(req.model_dump_json(), self._inputs, self._build_cpus)
            b = self._builds[key] = _Build(meta, data)
        return b

    def _baseline_ready(self) -> bool:
        base = self.requests.baseline_engine()
        return base is not None and base.is_file()

    def want(self, route: Route, index: int) -> None:
        self._build(route, index)
        self._wanted[(route.text(), index)] = route
        self._pump()

    def _job(self, route: Route, index: int, trial: TrialJob, role: str) -> _Job:
        plan = self.requests.plan
        key = plan.key(route)
        after = [j.index for j in self._jobs.values() if not j.stale and j.index < index
                 and plan.key(j.route) == key]
        job = _Job(route, index, trial, role, None if trial.reuse else
                   self._build(route, index), max(after) if after else None)
        self._jobs[(route.text(), index)] = job
        return job

    def _blob(self, path: Path) -> tuple[str, Any]:
        if path not in self._blobs:
            self._blobs[path] = (digest_file(path)[0], self.ray.put(path.read_bytes()))
        return self._blobs[path]

    def _build_done(self, b: _Build) -> bool:
        if b.result is not None:
            return True
        ready, _ = self.ray.wait([b.meta], timeout=0)
        if not ready:
            return False
        try:
            text, b.digest = self.ray.get(b.meta)
            b.result = RESULT.validate_json(text)
        except self.ray.exceptions.RayError as exc:
            b.result = FailedResult(outcome="crashed", reason="the build worker died twice "
                                    f"({first_line(exc)})")
        return True

    def _ready(self, job: _Job) -> bool:
        """Whether ``job`` can be sent to a measure worker (settles it when it needs none). A
        route with the build key of an earlier one waits until that one is recorded, then
        reuses its engine as the local scheduler does (when it passed)."""
        if job.after is not None and job.after >= self.requests.recorded():
            return False
        if job.role != "baseline":
            job.trial = self.requests.trial(job.route, job.index, job.role)
        if job.trial.reuse:
            return True
        if job.build is None:
            job.build = self._build(job.route, job.index)
            if job.build is None:
                return True
        if not self._build_done(job.build):
            return False
        result = job.build.result
        if not isinstance(result, BuiltResult):  # the build failed: no measurement
            assert result is not None  # a build that is done has its result
            job.out = (result, None, None, 0.0)
            return False
        return True

    def _meta(self, job: _Job) -> tuple[WorkerRequest, dict[str, Any], Any, Any]:
        """The measure job's request (``prebuilt`` set when its engine is sent along), how
        its engine and the baseline's travel, and their object references."""
        req, reuse = job.trial.req, job.trial.reuse
        meta: dict[str, Any] = {"mode": "none"}
        base_data = engine_data = None
        if req.baseline_engine:
            base = Path(req.baseline_engine)
            digest, base_data = self._blob(base)
            meta.update(baseline_name=base.name, baseline_digest=digest)
        if reuse is not None:
            digest, engine_data = self._blob(reuse)
            meta.update(mode="reuse", reuse_name=reuse.name, engine_digest=digest)
        elif job.build is not None:
            b = job.build
            assert isinstance(b.result, BuiltResult)
            meta.update(mode="built", engine_digest=b.digest)
            req = req.model_copy(update={"prebuilt": Prebuilt(
                build_s=b.result.build_s, facts={k: str(v) for k, v in b.result.facts.items()})})
            engine_data = b.data
        return req, meta, engine_data, base_data

    def _pump(self) -> None:
        """Collect finished measure jobs, then send waiting ones to free workers, in order."""
        ray = self.ray
        if self._wanted and self._baseline_ready():  # measure jobs go ahead once it is recorded
            done = self.requests.recorded()
            for (text, index), route in self._wanted.items():
                if index >= done and (text, index) not in self._jobs:
                    self._job(route, index, self.requests.trial(route, index, "search"),
                              "search")
            self._wanted.clear()
        for w in list(self._workers):
            job = w.job
            if job is None or not ray.wait([job.ref], timeout=0)[0]:
                continue
            w.job = None
            try:
                text, data, digest, seconds = ray.get(job.ref)
                job.out = (RESULT.validate_json(text), data, digest, seconds)
            except ray.exceptions.RayActorError as exc:
                self._lost(w, job, exc)
            except ray.exceptions.RayError as exc:
                job.out = (FailedResult(outcome="runtime_error", reason=first_line(exc)),
                           None, None, 0.0)
            if job.stale:
                self._jobs.pop((job.route.text(), job.index), None)
        for job in sorted(self._jobs.values(), key=lambda j: j.index):
            free = min((w for w in self._workers if w.job is None), default=None,
                       key=lambda w: w.count)
            if free is None:
                break
            if job.out is not None or job.ref is not None or job.stale or not self._ready(job):
                continue
            req, meta, engine_data, base_data = self._meta(job)
            job.mode = meta["mode"]
            job.ref = free.handle.measure.remote(req.model_dump_json(), meta, engine_data,
                                                 base_data)
            job.attempts += 1
            free.job = job
            free.count += 1

    def _lost(self, w: _Worker, job: _Job | None, exc: Exception) -> None:
        """``w`` died running ``job``: replace it; re-queue the job once."""
        self._workers.remove(w)
        where = w.hello["where"]
        what = f"measure worker {where['worker_host']} GPU {where['worker_gpu']} died"
        if job is None:
            pass
        elif job.attempts >= ATTEMPTS:
            job.ref = None
            job.out = (FailedResult(outcome="crashed", reason=(
                f"the {what} in every attempt ({job.attempts}) of this trial"),
                facts=dict(where)), None, None, 0.0)
        else:
            job.ref = None
            self.notes.append(f"{what} during trial {job.index}: trial re-queued")
        try:
            self._add_worker()
        except self.ray.exceptions.RayError as err:
            self.notes.append(f"could not replace the {what}: {first_line(err)}")
        if not self._workers:
            raise TuneError(f"the {what} and no measure worker is left ({first_line(exc)})")

    def trial(self, route: Route, index: int, trial: TrialJob,
              started: Callable[[], None]) -> tuple[WorkerResult, float]:
        started()
        req = trial.req
        job = self._jobs.get((route.text(), index))
        if job is None or job.stale:
            job = self._job(route, index, trial, "baseline" if req.baseline_engine is None
                            else "search")
        for other in self._jobs.values():  # routes planned for this index that did not come
            if other.index <= index and other is not job:
                other.stale = True
        while job.out is None:
            self._pump()
            refs = [w.job.ref for w in self._workers if w.job is not None]
            refs += [job.build.meta] if job.build is not None and job.build.result is None else []
            if job.out is None and refs:
                self.ray.wait(refs, num_returns=1, timeout=WAIT_S)
            elif job.out is None:
                time.sleep(WAIT_S)
        self._jobs.pop((route.text(), index), None)
        for key in [k for k, j in self._jobs.items() if j.stale and j.ref is None]:
            del self._jobs[key]
        result, data, digest, seconds = job.out
        if data is not None:
            try:
                write_checked(Path(req.engine or ""), data, digest or "")
            except OSError as exc:
                raise TuneError(f"trial {index}: the engine from the measure worker: "
                                f"{exc}") from exc
        build_s = 0.0
        b = job.build
        if job.mode == "built" and b is not None and isinstance(b.result, BuiltResult):
            result = with_build_phases(result, Build(None, route, Path(), result=b.result))
            build_s = b.result.build_s
        elif job.mode == "none" and b is not None and b.result is not None:  # the build failed
            build_s = getattr(b.result, "build_s", None) or 0.0
        self._pump()
        return result, seconds + build_s

    def measure_process(self, timing: TimingSettings, env: dict[str, str]) -> MeasureProcess:
        from dossier.measure.confirmation import ProcessRun

        spec = self.requests.spec

        def run(engines: Any, offset: int, /, *, more: bool = True) -> ProcessRun:
            blobs = [self._blob(Path(p)) for p, _ in engines]
            files = [(Path(p).name, d) for (p, _), (d, _) in zip(engines, blobs, strict=True)]
            for _ in range(ATTEMPTS):
                self._settle()
                w = self._workers[0]
                try:
                    return ProcessRun(**self.ray.get(w.handle.measure_process.remote(
                        timing.model_dump_json(), [r for _, r in engines], dict(spec.builder),
                        [x.model_dump(mode="json") for x in spec.shapes], files, offset,
                        *[ref for _, ref in blobs])))
                except self.ray.exceptions.RayActorError as exc:
                    self._lost(w, None, exc)
            raise TuneError("the measure worker died twice during the confirmation")

        return run

    def check(self, jobs: Sequence[CheckJob]) -> Generator[WorkerResult, None, None]:
        self._settle()  # the measure workers run the checks
        sent = []
        for i, job in enumerate(jobs):
            w = self._workers[i % len(self._workers)]
            data = Path(job.req.validation)
            if data not in self._sets:
                self._sets[data] = self._pack(folder_files(data, "data"), folder="data")
            digest, engine = self._blob(Path(job.req.engine or ""))
            sent.append((w, w.handle.check.remote(job.req.model_dump_json(), job.name,
                                                  self._sets[data],
                                                  (Path(job.req.engine or "").name, digest),
                                                  engine)))
        for w, ref in sent:
            result: WorkerResult
            try:
                result = RESULT.validate_json(self.ray.get(ref))
            except self.ray.exceptions.RayActorError as exc:
                if w in self._workers:
                    self._lost(w, None, exc)
                result = FailedResult(outcome="crashed", reason=f"the measure worker died "
                                      f"({first_line(exc)})")
            except self.ray.exceptions.RayError as exc:
                result = FailedResult(outcome="runtime_error", reason=first_line(exc))
            yield result

    def _settle(self) -> None:
        """Wait for the measure jobs still running (their results are not needed)."""
        self.drop_pending()
        while any(w.job is not None for w in self._workers):
            self.ray.wait([w.job.ref for w in self._workers if w.job is not None],
                          num_returns=1, timeout=WAIT_S)
            self._pump()

    def drop_pending(self) -> None:
        for j in self._jobs.values():
            j.stale = True
        self._jobs = {k: j for k, j in self._jobs.items() if j.ref is not None}

    def close(self) -> None:
        for w in self._workers:
            _close(self.ray, w.handle)
        self._workers.clear()
        if self.started:
            self.ray.shutdown()


@contextlib.contextmanager
def _neutral_cwd() -> Iterator[None]:
    """Ray puts the driver's working directory first on its workers' ``sys.path``: a folder
    named ``dossier`` there (a checkout, a run folder) would shadow the installed package and
    every worker would fail to import it. ``ray.init`` runs from the folder that holds the
    package this process imported, so that is the folder the workers get."""
    here = os.getcwd()
    os.chdir(Path(__file__).resolve().parents[2])  # the folder that holds the package
    try:
        yield
    finally:
        os.chdir(here)


def _close(ray: Any, handle: Any) -> None:
    """Let a measure worker remove its folder, then kill it."""
    with contextlib.suppress(Exception):  # a dead or stuck worker: killed all the same
        ray.get(handle.close.remote(), timeout=CLOSE_S)
    ray.kill(handle)


def _check_reachable(address: str | None) -> None:
    """Fail fast, with one line, on an address nothing answers at (Ray itself retries for
    minutes)."""
    if address is None or address == "auto":
        return
    host, _, port = address.split("://", 1)[-1].rpartition(":")
    if not host or not port.isdigit():
        raise InputError(f"--address {address!r} is not HOST:PORT (or auto)")
    try:
        socket.create_connection((host, int(port)), timeout=CONNECT_S).close()
    except OSError as exc:
        raise TuneError(f"cannot reach the Ray cluster at {address}: "
                        f"{exc.strerror or type(exc).__name__}",
                        hint="start it with `ray start --head`, or check --address") from exc
