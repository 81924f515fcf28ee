"""What runs on the workers of a Ray cluster (:mod:`dossier.executors.ray_cluster` drives
them): build tasks, and measure workers, one Ray actor per GPU, each job in a fresh child
process through the same worker code as locally. Files arrive packed by the driver and are
written once per node, each checked against the digest taken where it was read."""

from __future__ import annotations

import os
import re
import shutil
import socket
import tempfile
import time
from pathlib import Path
from typing import Any

from dossier.backends import get_backend
from dossier.errors import BackendUnavailableError
from dossier.files import remove_stale, replace_small
from dossier.fingerprint import Fingerprint, collect
from dossier.hashing import digest_bytes, digest_file
from dossier.jobs.builds import COMPILE_THREADS_ENV
from dossier.jobs.child import run_child
from dossier.jobs.worker import BuiltResult, WorkerRequest

MEASURE_PREFIX = "dossier-measure-"
"""A measure worker's folder is named by it and its pid (what a killed worker left is removed
by the next one on the node)."""
_MEASURE_STALE = re.compile(rf"^{MEASURE_PREFIX}(?P<pid>\d+)-")


def ray_module() -> Any:
    """Ray, imported; BackendUnavailableError when it is not installed."""
    try:
        import ray
    except ImportError as exc:
        raise BackendUnavailableError("--executor ray needs Ray, which is not installed",
                                      hint="pip install 'dossier[ray]'") from exc
    return ray


def materialize(inputs: dict[str, Any]) -> Path:
    """The folder of the files the driver packed (:class:`~dossier.executors.ray_cluster.
    RayScheduler`) on this node (written once per node, checked)."""
    root: Path = Path(tempfile.gettempdir()) / "dossier-ray" / str(inputs["key"])
    if not (root / ".complete").is_file():
        root.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix="inputs-", dir=root.parent))
        for rel, (digest, data) in inputs["files"].items():
            write_checked(tmp / rel, data, digest)
        (tmp / ".complete").write_text("")
        try:
            os.rename(tmp, root)
        except OSError:  # another job on this node was first
            shutil.rmtree(tmp, ignore_errors=True)
    return root


def _inputs(inputs: dict[str, Any]) -> tuple[Path, Path]:
    """The model and validation set on this node."""
    root = materialize(inputs)
    return root / inputs["model"], root / inputs["validation"]


def folder_files(folder: Path, under: str) -> dict[str, tuple[str, bytes]]:
    """The files of ``folder``, by their path under ``under``: (digest, bytes) each."""
    return {f"{under}/{f.relative_to(folder)}": (digest_file(f)[0], f.read_bytes())
            for f in sorted(folder.rglob("*")) if f.is_file()}


def write_checked(path: Path, data: bytes, digest: str) -> Path:
    """Write ``data`` to ``path`` after checking it has ``digest``."""
    got = digest_bytes(data)
    if got != digest:
        raise OSError(f"{path.name} arrived with digest {got}, sent as {digest}")
    path.parent.mkdir(parents=True, exist_ok=True)
    replace_small(path, data, suffix=".part")  # a full disk leaves no partial file
    return path


def _where(fp: Fingerprint, gpu: int | None) -> dict[str, str]:
    """The facts a trial records about the worker that measured it."""
    ray = ray_module()
    g = fp.gpus[gpu] if gpu is not None and gpu < len(fp.gpus) else None
    return {"worker_node": ray.get_runtime_context().get_node_id(),
            "worker_host": socket.gethostname(),
            "worker_gpu": "none" if gpu is None else
            f"{gpu} ({g.name}, {g.uuid})" if g is not None else str(gpu)}


def stack_facts(fp: Fingerprint, gpu: int | None, stack: dict[str, str]) -> dict[str, str | None]:
    """What a measure worker must share with the run: GPU model, driver, CUDA runtime, compiler
    and the backend's library versions."""
    g = fp.gpus[gpu] if gpu is not None and gpu < len(fp.gpus) else None
    return {"GPU model": g.name if g else None, "driver": g.driver_version if g else None,
            "CUDA": fp.cuda_runtime, "compiler": fp.compiler, **stack}


def mismatch(run: dict[str, str | None], worker: dict[str, str | None]) -> str | None:
    """How ``worker``'s facts differ from the run's (facts the run does not know are not
    compared), or None."""
    diffs = [f"{k} {worker.get(k)} (run: {v})" for k, v in run.items()
             if v is not None and worker.get(k) != v]
    return ", ".join(diffs) or None


def build_task(req_json: str, inputs: dict[str, Any], threads: int) -> tuple[tuple[str, str | None],
                                                                           bytes | None]:
    """A build job on a CPU worker: the result and the engine's digest, and the engine."""
    model, vset = _inputs(inputs)
    req = WorkerRequest.model_validate_json(req_json)
    work = Path(tempfile.mkdtemp(prefix="dossier-build-"))
    try:
        engine = work / Path(req.engine or "").name
        req = req.model_copy(update={"model": str(model), "validation": str(vset),
                                     "engine": str(engine)})
        result = run_child(req, work, "build", {COMPILE_THREADS_ENV: str(threads)})
        data = engine.read_bytes() if isinstance(result, BuiltResult) and engine.is_file() \
            else None
        return (result.model_dump_json(), digest_bytes(data) if data is not None else None), data
    finally:
        shutil.rmtree(work, ignore_errors=True)


class MeasureWorker:
    """A measure worker (a Ray actor on one GPU, or a CPU): each job in a fresh child process."""

    def __init__(self, inputs: dict[str, Any], backend: str, include_compiler: bool) -> None:
        ray = ray_module()
        self.model, self.vset = _inputs(inputs)
        self.backend = get_backend(backend)
        # named by pid: what a killed worker left is removed by the next one on the node
        remove_stale(Path(tempfile.gettempdir()), _MEASURE_STALE, dirs_only=True)
        self.root = Path(tempfile.mkdtemp(prefix=f"{MEASURE_PREFIX}{os.getpid()}-"))
        self.fp = collect(include_compiler=include_compiler)
        gpus = ray.get_gpu_ids()
        self.gpu = int(gpus[0]) if gpus else None
        self.where = _where(self.fp, self.gpu)

    def close(self) -> None:
        """Remove this worker's folder (the engines it kept); called before it is killed."""
        shutil.rmtree(self.root, ignore_errors=True)

    def hello(self) -> dict[str, Any]:
        """Who this worker is: its pid, where it runs, its facts and fingerprint."""
        return {"pid": os.getpid(), "where": self.where, "fingerprint": self.fp.model_dump_json(),
                "facts": stack_facts(self.fp, self.gpu, self.backend.stack())}

    def _keep(self, name: str, digest: str, data: bytes | None) -> Path:
        """An engine kept on this node by digest (the baseline is fetched once)."""
        path = self.root / "engines" / digest / name
        if not path.is_file():
            write_checked(path, data or b"", digest)
        return path

    def _env(self, *engines: str | Path | None) -> dict[str, str]:
        return self.backend.loader_env(*engines)

    def measure(self, req_json: str, meta: dict[str, Any], engine_data: bytes | None,
                baseline_data: bytes | None) -> tuple[str, bytes | None, str | None, float]:
        """One trial: the result, an ``ok`` trial's engine and its digest, and the seconds."""
        t0 = time.perf_counter()
        req = WorkerRequest.model_validate_json(req_json)
        name = Path(req.engine or "").stem
        work = self.root / name
        shutil.rmtree(work, ignore_errors=True)
        work.mkdir(parents=True)
        engine = work / Path(req.engine or "").name
        update: dict[str, Any] = {"model": str(self.model), "validation": str(self.vset),
                                  "engine": str(engine), "baseline_engine": None}
        if meta.get("baseline_digest"):
            update["baseline_engine"] = str(self._keep(meta["baseline_name"],
                                                       meta["baseline_digest"], baseline_data))
        src: Path | None = None
        if meta["mode"] == "built":
            write_checked(engine, engine_data or b"", meta["engine_digest"])
        elif meta["mode"] == "reuse":  # an earlier trial's engine, kept on this node
            src = self._keep(meta["reuse_name"], meta["engine_digest"], engine_data)
            shutil.copyfile(src, engine)
        req = req.model_copy(update=update)
        env = self._env(req.baseline_engine, engine, src)
        result = run_child(req, work, name, env)
        if hasattr(result, "facts"):
            result = result.model_copy(update={"facts": {**result.facts, **self.where}})
        data = engine.read_bytes() if result.outcome == "ok" and engine.is_file() else None
        shutil.rmtree(work, ignore_errors=True)
        return (result.model_dump_json(), data, digest_bytes(data) if data is not None else None,
                time.perf_counter() - t0)

    def check(self, req_json: str, name: str, data: dict[str, Any], engine: tuple[str, str],
              engine_data: bytes | None) -> str:
        """One check job (the hold-out check): the engine ``engine`` (name, digest; its bytes
        ``engine_data``) judged on the data set packed in ``data``; the result."""
        req = WorkerRequest.model_validate_json(req_json)
        kept = self._keep(*engine, engine_data)
        work = self.root / name
        shutil.rmtree(work, ignore_errors=True)
        work.mkdir(parents=True)
        req = req.model_copy(update={"model": str(self.model), "engine": str(kept),
                                     "validation": str(materialize(data) / data["folder"])})
        try:
            return run_child(req, work, name, self._env(kept)).model_dump_json()
        finally:
            shutil.rmtree(work, ignore_errors=True)

    def measure_process(self, timing_json: str, routes: list[str], builder: dict[str, Any],
                        shapes: list[dict[str, Any]], files: list[tuple[str, str]], offset: int,
                        *data: bytes) -> dict[str, Any]:
        """One measuring process of the confirmation (:mod:`dossier.measure.confirmation`) on this
        worker's device; ``files``: (name, digest) of each engine, in the order of ``routes``,
        their bytes in ``data``."""
        from dataclasses import asdict

        from dossier.jobs import measuring
        from dossier.measure.timing import TimingSettings
        from dossier.spec import ShapeEntry

        paths = [self._keep(n, d, b) for (n, d), b in zip(files, data, strict=True)]
        measure = measuring.local_processes(
            self.backend.name, self.vset, TimingSettings.model_validate_json(timing_json),
            builder=builder, shapes=[ShapeEntry.model_validate(x) for x in shapes],
            work=self.root / "confirm", env=self._env(*paths))
        # one process a call: no successor to start ahead on this worker
        return asdict(measure(list(zip(paths, routes, strict=True)), offset, more=False))
