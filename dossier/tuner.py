"""The tuner: strategy x backend x validation x timing, one child process per trial.

The tuner never prints; it reports progress to a :class:`TuneObserver`. Everything it learns is
appended to the tuning cache as it happens, so ``tune --continue`` picks up where a killed
search stopped: finished trials are never re-run, the best so far is never lost.
"""

from __future__ import annotations

import contextlib
import ctypes
import datetime as dt
import itertools
import os
import platform
import resource
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from pydantic import ValidationError

from dossier import __version__, replicate
from dossier.backends import Backend, get_backend
from dossier.cache import CacheHeader, DecisionRecord, FileIdentity, SessionRecord, TuningCache
from dossier.decision import calibration, candidates, decide
from dossier.errors import CacheMismatchError, InputError, OutputError, SpecError, TuneError
from dossier.fingerprint import collect
from dossier.hashing import digest_file
from dossier.knobs import KnobDatabase, KnobPhase
from dossier.routes import Route, Selection
from dossier.spec import ModelSection, ReleaseSection, ReleaseSpec, TuneSection, ValidationSection
from dossier.strategies import Strategy, get_strategy
from dossier.timing import compare, flatten, summarize, unflatten
from dossier.trial import Outcome, TrialRecord
from dossier.validation import ValidationSet, load_validation_set
from dossier.worker import WorkerRequest

CACHE_NAME = "tuning-cache.jsonl"
KNOBS_NAME = "knobs.json"
FINGERPRINT_NAME = "fingerprint.json"
ENGINES = "engines"
WORK = ".work"


class TuneObserver:
    """Receives progress; the CLI renders it. Every method is optional."""

    def started(self, planned: int, done: int) -> None:
        """The search starts: ``planned`` trials (an upper bound for mixed), ``done`` restored."""

    def trial_started(self, index: int, route: str, role: str) -> None:
        """A trial's child process starts."""

    def trial_finished(self, record: TrialRecord) -> None:
        """A trial's record was written to the cache."""

    def confirming(self, routes: list[str]) -> None:
        """The best candidates are being re-timed against the baseline."""


@dataclass
class Prepared:
    """Everything a search needs, checked."""

    spec: ReleaseSpec
    backend: Backend
    db: KnobDatabase
    selection: Selection
    strategy: Strategy
    model: Path
    vset: ValidationSet
    baseline: Route


@dataclass
class TuneResult:
    """A finished search."""

    run_dir: Path
    cache: TuningCache
    decision: DecisionRecord
    trials_run: int = 0
    notes: list[str] = field(default_factory=list)


def _now() -> str:
    return dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")


def prepare(spec: ReleaseSpec) -> Prepared:
    """Resolve and check a spec: backend, knobs, selection, model, validation set.

    Raises the matching InputError subclass for anything that does not fit, before any file
    is written.
    """
    problems = spec.timing.problems()
    if problems:
        raise SpecError(f"[timing] cannot ship a gain: {'; '.join(problems)}",
                        hint="the signed-rank test over n rounds cannot give p below 2/2**n: "
                             "raise the rounds")
    backend = get_backend(spec.tune.backend)
    backend.require()
    backend.configure(spec.builder, spec.shapes)
    strategy = get_strategy(spec.tune.strategy)
    db = backend.knob_database()
    selection = Selection.parse(spec.tune.selection, db)
    model = spec.model_path()
    signature = backend.signature(model)
    vset = load_validation_set(spec.resolve(spec.validation.path))
    for pair in vset.pairs:
        signature.check_pair(pair.name, pair.inputs, pair.references)
    baseline = selection.baseline(db)
    probe = dict(baseline.as_dict())
    for item in selection.items:
        for value in item.values:
            if value == "off":
                probe[item.knob] = "off"
    backend.check_route(model, Route.of(probe), db)
    return Prepared(spec, backend, db, selection, strategy, model, vset, baseline)


def plan(spec: ReleaseSpec) -> tuple[Route, list[Route]]:
    """The baseline and the ordered routes of a strategy that plans ahead (``--dry-run``)."""
    p = prepare(spec)
    if not p.strategy.plans_ahead:
        raise InputError(f"--dry-run cannot list the routes of strategy {p.strategy.name!r}: its "
                        "second phase depends on measured results",
                        hint="dry-run the fast phase with --strategy fast")
    return p.baseline, p.strategy.plan(p.selection, p.db)


def _header(p: Prepared, spec_path: Path | None, warm_start: list[Route],
            parent: str | None) -> CacheHeader:
    digest, size = digest_file(p.model)
    host = {"hostname": platform.node(), "machine": platform.machine(),
            "python": platform.python_version(), **p.backend.stack()}
    return CacheHeader(
        tool_version=__version__, created_at=_now(), release=p.spec.release.name,
        release_version=p.spec.release.version, description=p.spec.release.description,
        backend=p.backend.name, tuner_version=p.db.tuner_version, knob_db_digest=p.db.digest(),
        selection=p.selection.text(), strategy=p.strategy.name, metric=p.spec.tune.metric,
        threshold=p.spec.tune.threshold, atol=p.spec.tune.atol, rtol=p.spec.tune.rtol,
        timing=p.spec.timing, model=FileIdentity(path=str(p.model), size=size, digest=digest),
        validation_path=str(p.vset.path.resolve()), validation_digest=p.vset.digest(),
        validation_pairs=len(p.vset.pairs), baseline_route=p.baseline.text(),
        shapes=p.spec.shapes, deployment=p.spec.deployment, builder=p.spec.builder,
        spec_path=str(spec_path.resolve()) if spec_path else None, host=host,
        warm_start=[r.text() for r in warm_start], parent=parent)


def spec_from_header(h: CacheHeader) -> ReleaseSpec:
    """The spec a cache was started from (for ``--continue``); CacheMismatchError when the
    header's settings do not make a valid spec (an edited or corrupt cache)."""
    try:
        return ReleaseSpec(
            release=ReleaseSection(name=h.release, version=h.release_version,
                                   description=h.description),
            model=ModelSection(path=h.model.path),
            validation=ValidationSection(path=h.validation_path),
            tune=TuneSection(backend=h.backend, strategy=h.strategy, selection=h.selection,
                             metric=h.metric, threshold=h.threshold, atol=h.atol, rtol=h.rtol),
            timing=h.timing, shapes=h.shapes, deployment=h.deployment, builder=h.builder,
            base_dir="/")
    except ValidationError as exc:
        err = exc.errors()[0]
        raise CacheMismatchError(f"the tuning cache header does not hold a valid release spec "
                                 f"({'.'.join(map(str, err['loc']))}: {err['msg']})") from exc


def _check_resume(cache: TuningCache, fresh: CacheHeader) -> None:
    old = cache.header
    checks = [("model", old.model.digest, fresh.model.digest),
              ("validation set", old.validation_digest, fresh.validation_digest),
              ("knob database", old.knob_db_digest, fresh.knob_db_digest),
              ("selection", old.selection, fresh.selection),
              ("strategy", old.strategy, fresh.strategy),
              ("backend", old.backend, fresh.backend),
              ("metric", old.metric, fresh.metric),
              ("threshold", old.threshold, fresh.threshold),
              ("timing settings", old.timing, fresh.timing),
              ("builder options", old.builder, fresh.builder),
              ("shape distribution", old.shapes, fresh.shapes),
              ("warm start", old.warm_start, fresh.warm_start)]
    for what, was, now in checks:
        if was != now:
            raise CacheMismatchError(
                f"cannot continue {cache.path}: the {what} changed since the search started "
                f"({_short(was)} -> {_short(now)})")


def _short(v: object) -> str:
    s = str(v)
    return s if len(s) <= 40 else s[:37] + "..."


def _child_setup(memory_mb: int | None, parent: int) -> None:  # runs in the child before exec
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    if os.getppid() != parent:  # the search died between fork and prctl: do not outlive it
        os._exit(1)
    if memory_mb:
        limit = memory_mb << 20
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))


def run_child(req: WorkerRequest, work: Path, name: str, timeout: float,
              memory_mb: int | None) -> tuple[dict | None, str]:
    """Run one worker request in its own process; (result or None, reason when None)."""
    req_path = work / f"{name}.request.json"
    log_path = work / f"{name}.log"
    req = req.model_copy(update={"spawned_at": time.time()})
    req_path.write_text(req.model_dump_json())
    Path(req.result).unlink(missing_ok=True)
    Path(req.stage).write_text("start")
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "PYTHONFAULTHANDLER": "1"}
    parent = os.getpid()
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(  # noqa: S603 - our own interpreter and module
            [sys.executable, "-m", "dossier.worker", str(req_path)], stdin=subprocess.DEVNULL,
            stdout=log, stderr=log, env=env, start_new_session=True,
            preexec_fn=lambda: _child_setup(memory_mb, parent))
        try:
            rc = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            stage = Path(req.stage).read_text()
            return None, f"timeout: killed after {timeout:g} s during {stage}"
        except BaseException:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            raise
    stage = Path(req.stage).read_text() if Path(req.stage).exists() else "start"
    if rc < 0:
        sig = signal.Signals(-rc).name
        hint = " (possibly out of memory)" if -rc == signal.SIGKILL else ""
        return None, f"crashed: killed by {sig} during {stage}{hint}"
    if not Path(req.result).exists():
        tail = log_path.read_text(errors="replace").strip().splitlines()[-1:] or [""]
        if "MemoryError" in log_path.read_text(errors="replace"):
            return None, f"crashed: out of memory during {stage}"
        return None, f"crashed: exited with status {rc} during {stage} without a result {tail[0]}".strip()
    import json

    return json.loads(Path(req.result).read_text()), ""


class Tuner:
    """One search over one run folder."""

    def __init__(self, p: Prepared, run_dir: Path, cache: TuningCache,
                 observer: TuneObserver | None = None, warm_start: list[Route] | None = None) -> None:
        self.p, self.run_dir, self.cache = p, run_dir, cache
        self.warm_start = list(warm_start or [])
        self.observer = observer or TuneObserver()
        self.work = run_dir / WORK
        self.engines = run_dir / ENGINES
        self.work.mkdir(exist_ok=True)
        self.engines.mkdir(exist_ok=True)
        self.ran = 0

    def _request(self, **kw: object) -> WorkerRequest:
        s = self.p.spec
        return WorkerRequest(backend=self.p.backend.name, model=str(self.p.model),
                             validation=str(self.p.vset.path), metric=s.tune.metric,
                             threshold=s.tune.threshold, atol=s.tune.atol, rtol=s.tune.rtol,
                             timing=s.timing, baseline_route=self.p.baseline.text(),
                             builder=s.builder, shapes=s.shapes,
                             result=str(self.work / "result.json"),
                             stage=str(self.work / "stage"), **kw)  # type: ignore[arg-type]

    def _baseline_engine(self) -> Path | None:
        base = next((t for t in self.cache.trials if t.role == "baseline"), None)
        return self.run_dir / base.engine if base and base.engine else None

    def run_trial(self, route: Route, role: str) -> TrialRecord:
        """Run one trial in a child process and append its record."""
        index = len(self.cache.trials)
        engine = self.engines / f"trial-{index:04d}{self.p.backend.engine_suffix}"
        self.observer.trial_started(index, route.text(), role)
        base_engine = self._baseline_engine() if role != "baseline" else None
        same = self._same_build(route)
        req = self._request(mode="trial", route=route.text(), engine=str(engine),
                            baseline_engine=str(base_engine) if base_engine else None,
                            reuse_engine=str(self.run_dir / same.engine) if same else None,
                            reuse_facts=dict(same.extra) if same else {})
        started = _now()
        t0 = time.perf_counter()
        timing = self.p.spec.timing
        name = f"trial-{index:04d}"
        built: dict | None = None
        log = self.work / f"{name}.log"
        if self.p.backend.separate_build and same is None:
            log = self.work / f"{name}-build.log"
            built, why = run_child(req.model_copy(update={"mode": "build"}), self.work,
                                   name + "-build", timing.trial_timeout_s,
                                   timing.trial_memory_limit_mb)
            data = built
            if built is not None and built.get("outcome") == "built":
                log = self.work / f"{name}.log"
                req = req.model_copy(update={"prebuilt_build_s": built["build_s"],
                                             "reuse_facts": built.get("facts") or {}})
                data, why = run_child(req, self.work, name, timing.trial_timeout_s,
                                      timing.trial_memory_limit_mb)
                if data is not None:
                    data["phases_s"] = {
                        **{f"{k}_build": v for k, v in (built.get("phases_s") or {}).items()
                           if k != "build"},
                        "build": (built.get("phases_s") or {}).get("build", built["build_s"]),
                        **{k: v for k, v in (data.get("phases_s") or {}).items() if k != "build"}}
        else:
            data, why = run_child(req, self.work, name, timing.trial_timeout_s,
                                  timing.trial_memory_limit_mb)
        trial_s = time.perf_counter() - t0
        record = self._record(index, route, role, data, why, engine, trial_s, started)
        if data is None and log.is_file():  # keep what the dying process said last
            tail = log.read_text(errors="replace").strip().splitlines()[-20:]
            record = record.model_copy(update={"extra": {**record.extra,
                                                         "log_tail": "\n".join(tail)}})
        if record.outcome is not Outcome.OK:
            engine.unlink(missing_ok=True)
        self.cache.append(record)
        self.ran += 1
        self.observer.trial_finished(record)
        return record

    def _build_key(self, route: Route) -> tuple[tuple[str, str], ...]:
        db = self.p.db
        return tuple((k, v) for k, v in route.effective(db).items()
                     if db.get(k).phase is KnobPhase.BUILD)

    def _same_build(self, route: Route) -> TrialRecord | None:
        """An earlier admissible trial whose build-time knobs equal ``route``'s: its engine is
        the same compiler output, so it is reused instead of rebuilt (load-time knobs differ)."""
        key = self._build_key(route)
        for t in self.cache.trials:
            if t.role != "confirm" and t.engine and (self.run_dir / t.engine).is_file() \
                    and self._build_key(Route.parse(t.route)) == key:
                return t
        return None

    def _record(self, index: int, route: Route, role: str, data: dict | None, why: str,
                engine: Path, trial_s: float, started: str) -> TrialRecord:
        common = dict(index=index, route=route.text(), role=role, trial_s=trial_s,
                      started_at=started)
        if data is None:
            outcome = Outcome.TIMEOUT if why.startswith("timeout") else Outcome.CRASHED
            return TrialRecord(**common, outcome=outcome, reason=why.split(": ", 1)[1])  # type: ignore[arg-type]
        outcome = Outcome(data["outcome"])
        settings = self.p.spec.timing
        timing_summary = comparison = None
        if data.get("samples_ms"):
            timing_summary = summarize(data["samples_ms"], settings.confidence, data["warmup_runs"])
            comparison = compare(unflatten(data["baseline_samples_ms"],
                                           data["baseline_sample_rounds"]),
                                 unflatten(data["samples_ms"], data["sample_rounds"]), settings,
                                 baseline_warmup=data["baseline_warmup_runs"])
        kept = outcome is Outcome.OK and engine.exists()
        return TrialRecord(
            **common, outcome=outcome, reason=data.get("reason"), losses=data.get("losses"),  # type: ignore[arg-type]
            worst_loss=data.get("worst_loss"), timing=timing_summary, comparison=comparison,
            samples_ms=data.get("samples_ms"), baseline_samples_ms=data.get("baseline_samples_ms"),
            sample_rounds=data.get("sample_rounds"),
            baseline_sample_rounds=data.get("baseline_sample_rounds"),
            build_s=data.get("build_s"), phases_s=data.get("phases_s") or {},
            engine=str(engine.relative_to(self.run_dir)) if kept else None,
            engine_digest=digest_file(engine)[0] if kept else None,
            extra={k: str(v) for k, v in (data.get("facts") or {}).items()})

    def confirm(self, chosen: list[TrialRecord]) -> None:
        """Re-measure the chosen candidates independently (:mod:`dossier.replicate`), together
        with the baseline and a second process of the baseline (the confirmation's A/A)."""
        self.observer.confirming([t.route for t in chosen])
        base = next(t for t in self.cache.trials if t.role == "baseline")
        timing = self.p.spec.timing
        started = _now()
        engines = [(self.run_dir / t.engine, t.route) for t in [base, base, *chosen]]  # type: ignore[operator]
        m = replicate.measure(self.p.backend.name, engines, self.p.vset.path, timing,
                              builder=self.p.spec.builder, shapes=self.p.spec.shapes,
                              work=self.work / "confirm")
        for j, t in enumerate([base, *chosen], start=1):
            samples, rounds = flatten(m.rounds[j])
            base_samples, base_rounds = flatten(m.rounds[0])
            index = len(self.cache.trials)
            alpha = timing.alpha if t is base else timing.alpha / len(chosen)
            rec = TrialRecord(
                index=index, route=t.route, role="confirm", outcome=Outcome.OK, trial_s=m.wall_s,
                started_at=started, timing=summarize(samples, timing.confidence, m.warmup_runs[j]),
                comparison=compare(m.rounds[0], m.rounds[j], timing, alpha=alpha,
                                   baseline_warmup=m.warmup_runs[0], procedure="independent"),
                samples_ms=samples, baseline_samples_ms=base_samples, sample_rounds=rounds,
                baseline_sample_rounds=base_rounds, engine=t.engine,
                engine_digest=t.engine_digest, worst_loss=t.worst_loss, losses=t.losses)
            self.cache.append(rec)
            self.observer.trial_finished(rec)

    def search(self) -> DecisionRecord:
        """Run (or finish) the search and decide."""
        results = {t.route: t for t in self.cache.trials if t.role != "confirm"}
        s = self.p
        planned = s.strategy.count(s.selection, s.db) + len(self.warm_start)
        if s.baseline.text() not in {r.text() for r in s.strategy.plan(s.selection, s.db)} \
                if s.strategy.plans_ahead else False:
            planned += 1
        self.observer.started(planned, len(results))
        base = next((t for t in self.cache.trials if t.role == "baseline"), None)
        if base is None:
            base = self.run_trial(s.baseline, "baseline")
            results[base.route] = base
        if base.outcome is not Outcome.OK:
            raise TuneError(f"the baseline route {s.baseline} did not pass: {base.outcome.value}: "
                            f"{base.reason}", hint="dossier needs a working baseline to compare "
                            "against; fix the model, the validation set or the threshold")
        for route in itertools.chain(self.warm_start,
                                     s.strategy.routes(s.selection, s.db, results)):
            if route.text() in results:
                continue
            results[route.text()] = self.run_trial(route, "search")
        if self.cache.decision is not None:
            return self.cache.decision
        confirmed = {t.route for t in self.cache.trials if t.role == "confirm"}
        top = candidates(self.cache.trials, s.spec.timing)[: s.spec.timing.confirm_top]
        aa = calibration(self.cache.trials, s.spec.timing)
        if top and s.spec.timing.confirm_top > 0 and not (aa and aa.significant) \
                and not {t.route for t in top} <= confirmed:
            self.confirm(top)  # not yet, or a round cut short by a kill: re-time it whole
        decision = decide(self.cache.trials, s.spec.timing)
        self.cache.append(decision)
        return decision


def tune(spec: ReleaseSpec, out: Path, *, observer: TuneObserver | None = None,
         spec_path: Path | None = None, resume: bool = False,
         warm_start: list[str] | None = None, parent: str | None = None) -> TuneResult:
    """Search ``spec``'s selection and decide, writing everything under ``out``.

    ``out`` must not hold a search yet unless ``resume``; with ``resume`` the cache there is
    checked against the spec's inputs (model, validation set, knob database, selection...) and
    the search continues. ``warm_start`` routes are measured first, right after the baseline
    (routes the selection does not allow are refused); ``parent`` is recorded in the header.
    """
    p = prepare(spec)
    warm = [Route.parse(text, p.db) for text in (warm_start or [])]
    out = Path(out)
    cache_path = out / CACHE_NAME
    fresh = _header(p, spec_path, warm, parent)
    if resume:
        cache = TuningCache.open(cache_path, repair=True)
        _check_resume(cache, fresh)
    elif out.exists() and any(out.iterdir()):
        raise OutputError(f"output folder {out} is not empty",
                          hint="choose a new --out, or --continue the search that is there")
    try:
        if not resume:
            out.mkdir(parents=True, exist_ok=True)
            cache = TuningCache.create(cache_path, fresh)
        # written after the header: a kill in between leaves them to --continue (the knob
        # database matches the header's digest; the fingerprint is of the host tuning now)
        if not (out / KNOBS_NAME).is_file():
            _write_json(out / KNOBS_NAME, p.db.model_dump_json(indent=2))
        if not (out / FINGERPRINT_NAME).is_file():
            _write_json(out / FINGERPRINT_NAME,
                        collect(include_compiler=p.backend.name == "torch-inductor")
                        .model_dump_json(indent=2))
    except OSError as exc:
        raise OutputError(f"cannot write to {out}: {exc.strerror}") from exc
    tuner = Tuner(p, out, cache, observer, warm)
    started, t0 = _now(), time.perf_counter()
    try:
        decision = tuner.search()
    except KeyboardInterrupt:
        cache.append(SessionRecord(started_at=started, wall_s=time.perf_counter() - t0,
                                   trials_run=tuner.ran, interrupted=True))
        raise
    cache.append(SessionRecord(started_at=started, wall_s=time.perf_counter() - t0,
                               trials_run=tuner.ran, interrupted=False))
    shutil.rmtree(tuner.work, ignore_errors=True)
    return TuneResult(out, cache, decision, tuner.ran)


def _write_json(path: Path, text: str) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(text + "\n", encoding="utf-8")
    os.replace(tmp, path)


def continue_tune(cache_path: Path, *, observer: TuneObserver | None = None) -> TuneResult:
    """Resume the search recorded in ``cache_path`` (its folder is the run folder)."""
    cache_path = Path(cache_path)
    if cache_path.is_dir():
        cache_path = cache_path / CACHE_NAME
    cache = TuningCache.open(cache_path)
    spec = spec_from_header(cache.header)
    path = Path(cache.header.spec_path) if cache.header.spec_path else None
    return tune(spec, cache_path.parent, observer=observer, spec_path=path, resume=True,
                warm_start=cache.header.warm_start, parent=cache.header.parent)
