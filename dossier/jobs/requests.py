"""The requests of one search's jobs: what a scheduler sends to the worker processes.

A scheduler (:mod:`dossier.executors`) runs the build and measure jobs of a search; it gets
their requests from a :class:`JobRequests`, never from the tuner itself. The requests follow
the search's state: a trial's measure job names the baseline engine once the baseline trial is
recorded, and the engine of an earlier trial with the same build key (:mod:`dossier.
build_plan`) once that one is.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dossier.build_plan import BuildPlan
from dossier.cache import TuningCache
from dossier.decision import race_bar
from dossier.jobs.worker import Prebuilt, WorkerRequest
from dossier.knobs import KnobDatabase
from dossier.measure.timing import TimingSettings
from dossier.routes import Route
from dossier.run_folder import holdout_name
from dossier.spec import ReleaseSpec, ShapeEntry

SCRATCH = "build-scratch"
"""The folder, in a search's work folder, where builds share intermediate results."""
Accuracy = tuple[str, float, float, float]
"""The accuracy rule a request judges by: metric, threshold, atol, rtol."""


def new_request(backend: str, validation: Path, timing: TimingSettings, *,
                work: Path | None, accuracy: Accuracy | None = None, baseline_route: str = "",
                model: str = "", builder: Mapping[str, Any] | None = None,
                shapes: Sequence[ShapeEntry] = (), **kw: Any) -> WorkerRequest:
    """A worker request: every one is made here (a search's jobs, the confirmation's
    measuring processes, ``verify``'s re-check and re-timing). ``work``: the folder of its
    result and stage files (None: named later, per process); ``accuracy``: the rule it judges
    by (None: it judges nothing, as a measuring process). Its process's time and memory
    limits are ``timing``'s trial limits."""
    metric, threshold, atol, rtol = accuracy or ("linf", 1.0, 1e-5, 1e-5)
    return WorkerRequest(backend=backend, model=model, validation=str(validation),
                         metric=metric, threshold=threshold, atol=atol, rtol=rtol,
                         timing=timing, timeout_s=timing.trial_timeout_s,
                         memory_mb=timing.trial_memory_limit_mb, baseline_route=baseline_route,
                         builder=dict(builder or {}), shapes=list(shapes),
                         result=str(work / "result.json") if work else "",
                         stage=str(work / "stage") if work else "", **kw)


@dataclass(frozen=True)
class TrialJob:
    """A trial's measure job."""

    req: WorkerRequest
    reuse: Path | None = None
    """The engine of an earlier trial with the same build key, placed as ``req.engine`` before
    the job starts (the request says so in ``prebuilt``); None: the engine is built."""


@dataclass(frozen=True)
class CheckJob:
    """A check job: an engine in place judged on a data set of its own (the hold-out check),
    in a process of its own."""

    req: WorkerRequest
    name: str
    """What its request, result and log files are named by."""


class JobRequests:
    """The request factory of one search (see the module's documentation)."""

    def __init__(self, spec: ReleaseSpec, backend: str, model: Path, validation: Path,
                 baseline: Route, db: KnobDatabase, plan: BuildPlan, cache: TuningCache,
                 run_dir: Path, engines: Path, work: Path,
                 calibration: Path | None = None) -> None:
        """``engines``: the run folder's engine folder; ``work``: its work folder (results,
        logs, stage markers); ``calibration``: the calibration set's folder, if any."""
        self.spec, self.backend, self.model, self.validation = spec, backend, model, validation
        self.baseline, self.db, self.plan, self.cache = baseline, db, plan, cache
        self.run_dir, self.engines, self.work = run_dir, engines, work
        self.calibration = calibration

    def request(self, **kw: object) -> WorkerRequest:
        """A request with the search's settings, and ``kw``."""
        s = self.spec
        return new_request(self.backend, self.validation, s.timing, work=self.work,
                           accuracy=(s.tune.metric, s.tune.threshold, s.tune.atol, s.tune.rtol),
                           baseline_route=self.baseline.text(), model=str(self.model),
                           builder=s.builder, shapes=s.shapes, knobs=self.db,
                           calibration=str(self.calibration) if self.calibration else None,
                           build_scratch=str(self.work / SCRATCH), **kw)

    def build(self, route: Route, engine: Path) -> WorkerRequest:
        """The build job of ``route``, writing ``engine``."""
        return self.request(mode="build", route=route.text(), engine=str(engine))

    def recorded(self) -> int:
        """Trials recorded so far (the next trial's index)."""
        return len(self.cache.trials)

    def baseline_engine(self) -> Path | None:
        """The baseline trial's engine, once that trial is recorded with one."""
        base = next((t for t in self.cache.trials if t.role == "baseline"), None)
        return self.run_dir / base.engine if base and base.engine else None

    def trial(self, route: Route, index: int, role: str) -> TrialJob:
        """The measure job of trial ``index``: its engine file, the baseline engine to time it
        against, and an earlier trial's engine with the same build key to reuse."""
        engine = self.engines / self.plan.engine_name(index)
        base_engine = self.baseline_engine() if role != "baseline" else None
        same = self.plan.reuse(route, self.cache.trials, self.run_dir)
        bar = race_bar(self.cache.trials, self.spec.timing) if role == "search" else None
        req = self.request(mode="trial", route=route.text(), engine=str(engine),
                           race_below=bar[0] if bar else None, race_why=bar[1] if bar else "",
                           baseline_engine=str(base_engine) if base_engine else None,
                           prebuilt=Prebuilt(facts=self.plan.reused_facts(same))
                           if same is not None else None)
        return TrialJob(req, self.run_dir / same.engine if same and same.engine else None)

    def check(self, route: str, index: int, engine: Path, data: Path) -> CheckJob:
        """The check job of trial ``index``'s ``engine`` (of ``route``) on the data set in the
        folder ``data`` (the hold-out set), judged by the search's accuracy rule."""
        req = self.request(mode="validate", engine=str(engine), route=route)
        return CheckJob(req.model_copy(update={"validation": str(data)}), holdout_name(index))
