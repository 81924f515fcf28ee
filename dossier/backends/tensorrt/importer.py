"""trtexec interop at the bundle level: import a trtexec tuning run as a dossier bundle, export a
dossier search as a trtexec tuning cache.

The one module of a backend that builds on :mod:`dossier.bundle` (it describes a
:class:`~dossier.bundle.builder.BundleContent`); the rest of the backend never imports it, and
bundle/ never imports a backend (``tests/project/test_layering.py``).

**Import** (:func:`import_trtexec`) turns trtexec's ``--tuningCacheFile`` (see
:mod:`dossier.backends.tensorrt.trtexec`) and the engine trtexec copied to ``--saveEngine`` into
``OUT/NAME-VERSION.dossier``. What trtexec does not record is not invented:

- pass/fail is derived from the losses and the header's ``epsilon`` (a loss >= epsilon fails);
- the winner is the one trtexec would pick (:func:`~dossier.backends.tensorrt.trtexec.trtexec_winner`: lowest
  ``gpu_time`` among passing rows, strict ``<``), and the decision says it was **not
  statistically checked** (one mean per route including warm-up, no repeats, no significance
  test); there is no speedup, interval or p-value, and ``gain`` says only that a route other than
  the baseline ships;
- the tuning host is **unknown**: ``fingerprint.json`` is an empty placeholder (no field is this
  host's), ``tuning_host`` says "unknown", and the shipped engine carries the flag
  ``tuning_host_unknown``, so ``verify`` judges every field "cannot be compared" (SUBOPTIMAL),
  never VALID;
- the files the header names (model, pair 0's inputs and reference outputs, the saved engine)
  are hashed where they still exist (trtexec records no hashes, so they may have changed since
  the search); the model is included; the raw validation files are not (converting them needs
  the engine's tensor shapes and types), so ``verify --recheck`` cannot run;
- the engine ships (``--engine``, required: a bundle without its engine would ship nothing);
  its plan header gives the TensorRT version that built it; ``--baseline-engine`` may add the
  baseline's (trtexec ``--saveAllEngines`` keeps one per iteration); without it the manifest's
  baseline engine is null;
- the knob database is ``--knobs`` (TensorRT's ``all_build_routes`` JSON, checked against the
  cache) or, without it, inferred from the cache and marked as inferred;
- the original cache is kept verbatim (``trtexec/tuning-cache.jsonl``) with an import record
  (``trtexec/import.json``).

**Export** (:func:`export_trtexec_cache`) writes a bundle's (or run folder's) trials in trtexec's
format; :data:`EXPORT_LOSES` says what that loses.
"""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dossier.backends.tensorrt.knobs import parse_knob_json
from dossier.backends.tensorrt.plan import PlanHeader, PlanHeaderError, read_plan_header
from dossier.backends.tensorrt.trtexec import (
    SOURCE,
    TrtexecCacheError,
    TrtexecHeader,
    TrtexecIteration,
    hash_header_files,
    make_trtexec_header,
    read_trtexec_cache,
    to_trial_records,
    trtexec_winner,
    write_trtexec_cache,
)
from dossier.bundle.builder import (
    BundleContent,
    Copy,
    Data,
    EngineFile,
    ModelFiles,
    Table,
    WrittenBundle,
    build_bundle,
    check_target,
    json_bytes,
    trial_counts,
    trial_tables,
)
from dossier.bundle.manifest import MANIFEST_NAME, VALIDATION_JSON, Summary, ValidationInfo
from dossier.bundle.model import external_locations
from dossier.cache import CacheHeader, DecisionRecord, FileIdentity, TuningCache
from dossier.errors import InputError, ModelError, SelectionError, TuneError
from dossier.fingerprint import CpuInfo, Fingerprint, OsInfo, PythonInfo
from dossier.hashing import digest_file, digest_json
from dossier.knobs import Knob, KnobDatabase
from dossier.measure.timing import TimingSettings
from dossier.routes import Route, Selection
from dossier.run_folder import CACHE_NAME, FINGERPRINT_NAME, KNOBS_NAME, cache_file
from dossier.spec import ModelSection, ReleaseSection, ReleaseSpec, TuneSection, ValidationSection
from dossier.trial import Outcome, TrialRecord
from dossier.version import __version__

TRTEXEC_DIR = "trtexec"
"""Bundle folder of the import's own files."""
ORIGINAL_CACHE = f"{TRTEXEC_DIR}/{CACHE_NAME}"
"""The trtexec tuning cache, verbatim (under the name a tuning cache has)."""
IMPORT_RECORD = f"{TRTEXEC_DIR}/import.json"
"""What the import found and assumed (see :func:`import_trtexec`)."""
IMPORT_FORMAT = "dossier-trtexec-import"
"""``format`` of the import record."""
UNKNOWN = "unknown"

RULE = ("trtexec's rule, not statistically checked: among the iterations that did not crash, "
        "exited 0 and have every loss below epsilon, the lowest gpu_time wins, compared with a "
        "strict < (the first of equal times wins); gpu_time is one mean per route over every "
        "inference of the child, warm-up included; no repeats, no confidence interval, no "
        "significance test")
"""The decision rule of an imported search, in words."""

NOT_RECORDED = [
    "whether an iteration failed the accuracy check (derived here from the losses and epsilon)",
    "the loss of every validation pair but the last",
    "timing statistics (gpu_time is one mean per route, warm-up included): no samples, "
    "intervals or significance test",
    "the winner (derived here by trtexec's rule)",
    "wall times and timestamps",
    "file hashes (the files the header names were hashed at import, where they still exist)",
    "the tuning host: GPU, driver, CUDA and TensorRT versions (the plan header gives the "
    "TensorRT version that built the engine)",
]
"""What a trtexec tuning cache does not record (kept in the import record)."""

EXPORT_LOSES = [
    "every validation pair's loss but the last",
    "raw timing samples and the statistics (gpu_time is the median of warm samples, not "
    "trtexec's warm-up-including mean; intervals, p-values and the interleaved baseline "
    "comparisons are dropped)",
    "confirmation re-measurements",
    "the difference between build_failed, crashed, timeout and runtime_error (all crash: true)",
    "build and trial times, engine files and digests",
    "the decision (trtexec writes no winner row)",
    "the digests of the model and the validation set, and the tuning host's fingerprint",
]
"""What exporting dossier trials in trtexec's format loses (see
:func:`~dossier.backends.tensorrt.trtexec.write_trtexec_cache`)."""

_KNOBS_HINT = ("pass the all_build_routes JSON (trtexec --helpBuildRoute) of the TensorRT that ran "
               "the search, or leave --knobs out to infer one from the cache")
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")


# ------------------------------------------------------------------------------------ import
@dataclass(frozen=True)
class _Plan:
    """Everything an imported bundle is made of, checked before writing starts."""

    cache_path: Path
    header: TrtexecHeader
    iterations: list[TrtexecIteration]
    trials: list[TrialRecord]
    winner: int
    baseline: int | None
    db: KnobDatabase
    knobs_source: str
    selection: Selection
    baseline_route: str
    engine: Path
    engine_digest: str
    plan: PlanHeader
    baseline_engine: Path | None
    baseline_digest: str | None
    baseline_plan: PlanHeader | None
    model: Path
    model_identity: FileIdentity
    include_model: bool
    name: str
    version: int
    hashed: dict[str, FileIdentity | None]
    validation_pairs: int
    warnings: list[str] = field(default_factory=list)


def import_trtexec(tuning_cache: Path, out_dir: Path, *, engine: Path | None,
                   baseline_engine: Path | None = None, knobs: Path | None = None,
                   model: Path | None = None, name: str | None = None, version: int = 1,
                   include_model: bool = True) -> WrittenBundle:
    """Bundle a trtexec tuning run as ``out_dir/NAME-VERSION.dossier`` (see the module doc).

    ``engine`` is the plan trtexec copied to ``--saveEngine`` (the winner); ``baseline_engine``
    optionally the baseline's plan; ``knobs`` TensorRT's ``all_build_routes`` JSON; ``model``
    the ONNX when it is no longer where the cache header says. ``name`` defaults to the ONNX
    file's stem.

    Everything is checked before anything is written. Raises TrtexecCacheError (InputError) for
    an unreadable cache, InputError for a missing ``engine``, a file that is not a TensorRT
    plan, a knob database that does not match the cache or a bad name, ModelError when the
    model is not there, TuneError when no iteration passed (trtexec wrote no engine), and
    OutputError when the target exists or the release version does not increase.
    """
    plan = _prepare(Path(tuning_cache), engine=engine, baseline_engine=baseline_engine,
                    knobs=knobs, model=model, name=name, version=version,
                    include_model=include_model)
    check_target(out_dir, plan.name, plan.version)
    return build_bundle(_content(plan), Path(out_dir))


def _prepare(cache_path: Path, *, engine: Path | None, baseline_engine: Path | None,
             knobs: Path | None, model: Path | None, name: str | None, version: int,
             include_model: bool) -> _Plan:
    header, its = read_trtexec_cache(cache_path)
    if not its:
        raise TuneError(f"{cache_path} records no finished iteration; there is nothing to import")
    warnings: list[str] = []
    db, knobs_source = _knob_database(header, its, knobs, warnings)
    try:
        selection = Selection.parse(header.tuning_expr, db)
        for it in its:
            Route.parse(it.build_route, db)
    except SelectionError as exc:
        if knobs is not None:
            raise InputError(f"--knobs {knobs} does not match the trtexec cache {cache_path}: "
                             f"{exc}", hint=_KNOBS_HINT) from None
        raise TrtexecCacheError(f"{cache_path}: its routes contradict its own header: {exc}") \
            from None
    trials = to_trial_records(header, its)
    baseline_route = selection.baseline(db).text()
    baseline = 0 if header.searching_algorithm in ("fast", "mixed") else next(
        (i for i, t in enumerate(trials) if t.route == baseline_route), None)
    if baseline is not None:
        trials[baseline] = trials[baseline].model_copy(update={"role": "baseline"})
        if trials[baseline].route != baseline_route:
            warnings.append(f"iteration 0 (the baseline of a {header.searching_algorithm} "
                            f"search) built {trials[baseline].route}, but the knob database's "
                            f"defaults give {baseline_route}")
        baseline_route = trials[baseline].route
    else:
        warnings.append(f"no iteration built the baseline (default) route {baseline_route}: "
                        "trtexec's winner cannot be compared with the default route")
    winner = trtexec_winner(its, header.epsilon)
    if winner is None:
        raise TuneError(f"{cache_path}: no iteration passed (none finished without a crash, an "
                        "error or a loss >= epsilon with a gpu_time); trtexec wrote no engine, "
                        "so there is nothing to import")
    if engine is None:
        saved = header.files.save_engine
        hint = ("pass --engine PLAN: the winner's plan, which trtexec copies to --saveEngine"
                + (f" (the cache header names {saved}, which exists here; pass it if it still "
                   "holds this search's winner)" if saved and Path(saved).is_file() else ""))
        raise InputError("a bundle ships an engine, and the trtexec cache holds none", hint=hint)
    plan = _plan_header(Path(engine), "--engine")
    base_engine: Path | None = None
    base_plan: PlanHeader | None = None
    if baseline_engine is not None:
        if baseline is None:
            raise InputError("--baseline-engine given, but no iteration of this search built "
                             f"the baseline route {baseline_route}")
        base_plan = _plan_header(Path(baseline_engine), "--baseline-engine")
        if baseline == winner:
            warnings.append("--baseline-engine was not used: trtexec's winner is the baseline, "
                            "so the shipped engine is the baseline's")
        else:
            base_engine = Path(baseline_engine)
    if baseline != winner and base_engine is None:
        warnings.append("no baseline engine: trtexec keeps only the winner's (with "
                        "--saveAllEngines, pass SAVE.iterN of the baseline's row as "
                        "--baseline-engine); the shipped engine cannot be re-timed against it")
    hashed = hash_header_files(header)
    model_path = Path(model) if model is not None else (
        Path(header.files.onnx) if header.files.onnx else None)
    if model_path is None:
        raise ModelError("the trtexec cache names no ONNX model (files.onnx)",
                         hint="pass the model trtexec tuned with --model ONNX")
    if not model_path.is_file():
        raise ModelError(f"the model {model_path} is not there",
                         hint="pass it with --model ONNX (a bundle records the model's digest)")
    named = hashed.get("onnx")
    model_identity = named if model is None and named is not None else None
    if model_identity is None:
        digest, size = digest_file(model_path)
        model_identity = FileIdentity(path=str(model_path), size=size, digest=digest)
        if named is not None and digest != named.digest:
            raise ModelError(f"--model {model_path} is not the model the cache names "
                             f"({header.files.onnx}, which exists and differs)",
                             hint="leave --model out, or restore the model the search tuned")
    name = name or model_path.stem
    if not _NAME.match(name) or len(name) > 100:
        raise InputError(f"release name {name!r} is not letters, digits, '.', '_' and '-'",
                         hint="choose one with --name")
    engine_digest, _ = digest_file(Path(engine))
    _engine_vs_saved(engine_digest, hashed.get("save_engine"), header, warnings)
    missing = sorted(k for k, v in hashed.items() if v is None
                     and k not in ("save_engine", "onnx"))
    if missing:
        warnings.append(f"files the trtexec cache names are not there, so not hashed: "
                        f"{', '.join(missing)}")
    pairs = _reference_pairs(header)
    if pairs < 2:
        warnings.append(f"trtexec checked accuracy on {pairs} validation pair(s); accuracy "
                        "rests on fewer than two examples")
    return _Plan(cache_path=cache_path, header=header, iterations=its, trials=trials,
                 winner=winner, baseline=baseline, db=db, knobs_source=knobs_source,
                 selection=selection, baseline_route=baseline_route, engine=Path(engine),
                 engine_digest=engine_digest, plan=plan, baseline_engine=base_engine,
                 baseline_digest=None if base_engine is None else digest_file(base_engine)[0],
                 baseline_plan=base_plan, model=model_path, model_identity=model_identity,
                 include_model=include_model, name=name, version=version,
                 hashed=hashed, validation_pairs=pairs, warnings=warnings)


def _plan_header(path: Path, flag: str) -> PlanHeader:
    if not path.is_file():
        raise InputError(f"{flag} {path} does not exist",
                         hint="pass the plan trtexec wrote with --saveEngine")
    try:
        return read_plan_header(path)
    except PlanHeaderError as exc:
        raise InputError(f"{flag} {path}: {exc}",
                         hint="pass the plan trtexec wrote with --saveEngine") from None


def _engine_vs_saved(digest: str, saved: FileIdentity | None, header: TrtexecHeader,
                     warnings: list[str]) -> None:
    if saved is None:
        if header.files.save_engine:
            warnings.append(f"the cache header's --saveEngine file {header.files.save_engine} "
                            "is not there; that --engine is the search's winner is the "
                            "importer's word")
        return
    if digest != saved.digest:
        warnings.append(f"--engine differs from the cache header's --saveEngine file "
                        f"{saved.path} (another digest); the bundle ships --engine")


def _reference_pairs(header: TrtexecHeader) -> int:
    """Validation pairs: one per ``--loadRefOutputs`` in argv (pair 0 at least when the header
    names reference files)."""
    count = sum(1 for a in header.argv if a == "--loadRefOutputs"
                or a.startswith("--loadRefOutputs="))
    return max(count, 1 if header.files.ref_outputs else 0)


def _build_flags(argv: Sequence[str]) -> tuple[bool, str]:
    """(version compatible, hardware compatibility level) from trtexec's argv."""
    vc = any(a in ("--versionCompatible", "--vc") for a in argv)
    level = "none"
    for a in argv:
        if a.startswith("--hardwareCompatibilityLevel="):
            level = a.split("=", 1)[1] or "none"
    return vc, level


# ------------------------------------------------------------------------------- knob database
def _tokens(text: str) -> list[tuple[str, str]]:
    out = []
    for token in text.split():
        name, eq, value = token[1:].partition("=") if token.startswith("-") else ("", "", "")
        if not name or not eq:
            raise TrtexecCacheError(f"token {token!r} is not -knob=value")
        out.append((name, value))
    return out


def _knob_database(header: TrtexecHeader, its: Sequence[TrtexecIteration], knobs: Path | None,
                   warnings: list[str]) -> tuple[KnobDatabase, str]:
    defaults = _tokens(header.default_build_route)
    if knobs is not None:
        try:
            text = Path(knobs).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise InputError(f"cannot read --knobs {knobs}: "
                             f"{getattr(exc, 'strerror', None) or exc}") from None
        db = parse_knob_json(text)
        if db.tuner_version != header.tuner_version:
            raise InputError(f"--knobs {knobs} is the knob database of tuner "
                             f"{db.tuner_version}; the search ran with tuner "
                             f"{header.tuner_version}", hint=_KNOBS_HINT)
        for name, value in defaults:
            try:
                default = db.get(name).default
            except SelectionError as exc:
                raise InputError(f"--knobs {knobs} does not match the trtexec cache: {exc}",
                                 hint=_KNOBS_HINT) from None
            if default != value:
                raise InputError(f"--knobs {knobs} gives -{name} the default {default!r}; the "
                                 f"cache's default_build_route says {value!r}",
                                 hint="it is not the knob database the search used")
        return db, f"--knobs {Path(knobs).name} (TensorRT's all_build_routes JSON)"
    return _infer_knobs(header, its, defaults, warnings), "inferred from the trtexec cache"


def _infer_knobs(header: TrtexecHeader, its: Sequence[TrtexecIteration],
                 defaults: list[tuple[str, str]], warnings: list[str]) -> KnobDatabase:
    """A minimal knob database: knobs in default_build_route's order (then any other named),
    values in tuning_expr's listed order, then the others seen in routes, then the default."""
    seen: dict[str, list[str]] = {}

    def see(name: str, value: str) -> None:
        values = seen.setdefault(name, [])
        if value not in values:
            values.append(value)

    for name, _ in defaults:
        seen.setdefault(name, [])
    for name, value in _tokens(header.tuning_expr):
        for v in (value[1:-1].split("|") if value.startswith("[") and value.endswith("]")
                  else [value]):
            see(name, v)
    for it in its:
        for name, value in _tokens(it.build_route):
            see(name, value)
    default_of = dict(defaults)
    note = ("inferred from a trtexec tuning cache (default_build_route, tuning_expr and the "
            "routes built), not TensorRT's knob database: only the values seen are listed")
    knobs = []
    for name, values in seen.items():
        default = default_of.get(name)
        if default is None:
            default = values[0]
            warnings.append(f"knob -{name} is not in the cache's default_build_route; its "
                            f"default is taken as {default!r}")
        if default not in values:
            values.append(default)
        knobs.append(Knob(name=name, values=tuple(v for v in values if v), default=default,
                          help=note))
    warnings.append("the knob database was inferred from the routes in the cache (no --knobs): "
                    "allowed values are only those seen, defaults from default_build_route")
    return KnobDatabase(backend="tensorrt",
                        tuner_version=f"{header.tuner_version} (inferred from a trtexec tuning "
                        "cache)", knobs=tuple(knobs))


# ------------------------------------------------------------------------------------- write
def unknown_fingerprint() -> Fingerprint:
    """The placeholder fingerprint of a tuning host nobody recorded: every fact absent, the
    Python version "unknown"; nothing in it describes the host that made the bundle."""
    return Fingerprint(collected_at=UNKNOWN, hostname=None,
                       python=PythonInfo(version=UNKNOWN, implementation=UNKNOWN),
                       cpu=CpuInfo(), os=OsInfo())


def _decision(p: _Plan) -> DecisionRecord:
    gpu = {i: it.gpu_time for i, it in enumerate(p.iterations)}
    w = p.trials[p.winner]
    passing = sorted((gpu[i], i) for i, t in enumerate(p.trials)
                     if t.outcome is Outcome.OK and gpu[i] is not None and i != p.winner
                     and not p.iterations[i].error_message)
    win_ms = gpu[p.winner]
    reason = (f"trtexec's winner: {w.route or '(default route)'} (row {p.winner}, iter "
              f"{p.iterations[p.winner].iter}) has the lowest gpu_time, {win_ms:.4g} ms, of "
              f"{len(passing) + 1} passing row(s)")
    if p.baseline is not None and p.baseline != p.winner and gpu[p.baseline] is not None:
        b = gpu[p.baseline]
        ratio = f"ratio {b / win_ms:.3f}, " if win_ms else ""  # type: ignore[operator]
        reason += f"; the baseline measured {b:.4g} ms ({ratio}one mean each including warm-up)"
    elif p.baseline == p.winner:
        reason += "; it is the baseline"
    runner = passing[0] if passing else None
    if runner is not None and runner[1] != p.baseline:
        margin = f" ({runner[0] / win_ms - 1:+.1%})" if win_ms else ""  # type: ignore[operator]
        reason += f"; runner-up {p.trials[runner[1]].route} at {runner[0]:.4g} ms{margin}"
    reason += ("; not statistically checked: a difference this size may be noise, and "
               "rebuilding the route may not reproduce the engine")
    return DecisionRecord(rule=RULE, baseline_route=p.baseline_route, shipped_route=w.route,
                          shipped_index=p.winner, gain=w.route != p.baseline_route,
                          speedup=None, speedup_ci_low=None,
                          speedup_ci_high=None, p_value=None, reason=reason,
                          runner_up_route=p.trials[runner[1]].route if runner else None,
                          runner_up_speedup=None)


def _content(p: _Plan) -> BundleContent:
    """The imported bundle's content: the engines trtexec built, the model, the search record
    rewritten as a dossier tuning cache, the original cache and what the import found."""
    h = p.header
    vc, hw = _build_flags(h.argv)
    flags = {"version_compatible": vc, "hardware_compatible": hw not in ("none", ""),
             "tuning_host_unknown": True}

    def engine_file(src: Path, rel: str, digest: str, trial: TrialRecord,
                    ph: PlanHeader) -> EngineFile:
        facts = {k: v for k, v in trial.extra.items() if k != "trtexec_row"}
        facts.update({"format": "tensorrt-plan", "build_route": trial.route, **ph.facts(),
                      "tensorrt_version": ph.trt_version_text,
                      "tensorrt_version_source": "plan header bytes 24..27 (the TensorRT that "
                      "built the plan)",
                      "engine_source": "given at import; trtexec records no engine digest",
                      "version_compatible": str(vc).lower(),
                      "hardware_compatibility_level": hw})
        changed = InputError(f"{src} changed while it was imported",
                             hint="import again once nothing writes it")
        return EngineFile(Copy(src, rel, digest, changed), route=trial.route,
                          trial_index=trial.index, facts=facts, flags=dict(flags))

    shipped = engine_file(p.engine, f"engine/{p.name}.plan", p.engine_digest,
                          p.trials[p.winner], p.plan)
    trials = list(p.trials)
    trials[p.winner] = trials[p.winner].model_copy(update={"engine_digest": p.engine_digest})
    baseline = None
    if p.baseline_engine is not None and p.baseline_plan is not None and p.baseline is not None \
            and p.baseline_digest is not None:
        baseline = engine_file(p.baseline_engine, f"engine/{p.name}.baseline.plan",
                               p.baseline_digest, p.trials[p.baseline], p.baseline_plan)
        trials[p.baseline] = trials[p.baseline].model_copy(
            update={"engine_digest": p.baseline_digest})

    validation_digest = digest_json({k: v.digest if v else None for k, v in p.hashed.items()
                                     if k.startswith(("inputs:", "ref_outputs:"))})
    spec = ReleaseSpec(
        release=ReleaseSection(name=p.name, version=p.version, description=(
            f"imported from a trtexec tuning cache ({p.cache_path.name}, tuner "
            f"{h.tuner_version}, {h.searching_algorithm} search)")),
        model=ModelSection(path=str(p.model.resolve())), validation=ValidationSection(path=""),
        tune=TuneSection.model_validate({  # trtexec's metric name is a str: checked here
            "backend": "tensorrt", "selection": p.selection.text(),
            "strategy": h.searching_algorithm, "metric": h.metric, "threshold": h.epsilon,
            "atol": h.accuracy_parameter.atol, "rtol": h.accuracy_parameter.rtol}),
        timing=TimingSettings())
    cache_header = CacheHeader(
        tool_version=__version__, created_at=UNKNOWN, spec=spec,
        tuner_version=h.tuner_version, knob_db_digest=p.db.digest(),
        model=FileIdentity(path=str(p.model.resolve()), size=p.model_identity.size,
                           digest=p.model_identity.digest),
        validation_digest=validation_digest,
        validation_pairs=p.validation_pairs, baseline_route=p.baseline_route,
        host={"hostname": UNKNOWN})
    decision = _decision(p)
    lines = [cache_header.model_dump_json(), *(t.model_dump_json() for t in trials),
             decision.model_dump_json()]
    info = ValidationInfo(
        metric=h.metric, threshold=h.epsilon, atol=h.accuracy_parameter.atol,
        rtol=h.accuracy_parameter.rtol, pairs=[], pair_inputs={}, digest=validation_digest,
        references=f"trtexec --loadRefOutputs raw files ({p.validation_pairs} pair(s)); not "
        f"included: only pair 0's are named by the cache, hashed in {IMPORT_RECORD}")
    knob_names = [i.knob for i in p.selection.items]
    files: list[Copy | Data | Table] = [
        Data(CACHE_NAME, ("\n".join(lines) + "\n").encode()),
        Data(KNOBS_NAME, json_bytes(p.db.model_dump(mode="json"))),
        Data(FINGERPRINT_NAME, json_bytes(unknown_fingerprint().model_dump(mode="json"))),
        Copy(p.cache_path, ORIGINAL_CACHE),
        Data(IMPORT_RECORD, json_bytes(_import_record(p, shipped, baseline))),
        Data(VALIDATION_JSON, json_bytes(info.model_dump(mode="json"))),
        *trial_tables(trials, knob_names, p.db, p.winner, [])]
    summary = Summary(
        strategy=h.searching_algorithm, selection=cache_header.selection, metric=h.metric,
        threshold=h.epsilon, atol=h.accuracy_parameter.atol, rtol=h.accuracy_parameter.rtol,
        validation_pairs=p.validation_pairs, baseline_route=p.baseline_route,
        baseline_timing=None, shipped_route=decision.shipped_route, shipped_index=p.winner,
        gain=decision.gain, speedup=None, speedup_ci_low=None, speedup_ci_high=None,
        confidence=cache_header.timing.confidence, p_value=None,
        result="not statistically checked", reason=decision.reason, decision_rule=RULE,
        runner_up_route=decision.runner_up_route, runner_up_speedup=None,
        trial_counts=trial_counts(trials), confirm_trials=0, search_wall_s=0.0,
        build_s_total=0.0, sessions=0)
    warnings = [
        "imported from a trtexec tuning cache: the choice was not statistically checked "
        "(trtexec ranks one mean gpu_time per route, warm-up included, with a strict <)",
        "the tuning host is unknown: trtexec's tuning cache records no host, GPU, driver or "
        "library versions; verify cannot compare this host with it",
        "the validation set is not in the bundle (trtexec's raw reference files); losses are "
        "the last validation pair's only; verify --recheck cannot run",
        *p.warnings]
    model = ModelFiles(p.model, p.include_model, external_locations(p.model),
                       p.model_identity.digest,
                       ModelError(f"the model {p.model} changed while it was imported",
                                  hint="import again once nothing writes it"))
    return BundleContent(
        release=p.name, release_version=p.version, description=cache_header.description,
        parent=None, created_at=UNKNOWN, backend="tensorrt", tuner_version=h.tuner_version,
        knob_db_digest=p.db.digest(), summary=summary, shipped=shipped, baseline=baseline,
        baseline_is_shipped=p.baseline == p.winner, model=model, files=files,
        tuning_host={"hostname": UNKNOWN}, warnings=warnings)


def _import_record(p: _Plan, shipped: EngineFile, baseline: EngineFile | None) -> dict[str, Any]:
    def ident(v: FileIdentity | None) -> dict[str, Any] | None:
        return None if v is None else v.model_dump(mode="json")

    mtime = None
    try:
        mtime = dt.datetime.fromtimestamp(p.cache_path.stat().st_mtime,
                                          dt.timezone.utc).isoformat(timespec="seconds")
    except OSError:
        pass
    it = p.iterations[p.winner]
    return {
        "format": IMPORT_FORMAT,
        "format_version": 1,
        "tuning_cache": {"path": str(p.cache_path.resolve()), "bundled_as": ORIGINAL_CACHE,
                         "modified": mtime, "modified_note": "the file's modification time: "
                         "trtexec records no timestamps (a copy or touch changes it)"},
        "trtexec_header": p.header.model_dump(mode="json"),
        "header_files": {k: ident(v) for k, v in sorted(p.hashed.items())},
        "header_files_note": "xxh3-128 of the files the cache header names, taken at import "
                             "where they still exist; trtexec records no hashes, so they may "
                             "have changed since the search",
        "winner": {"row": p.winner, "iter": it.iter, "route": p.trials[p.winner].route,
                   "build_route": it.build_route, "gpu_time_ms": it.gpu_time, "rule": RULE},
        "baseline_row": p.baseline,
        "engine": {"given_as": str(p.engine.resolve()), "bundled_as": shipped.file.rel,
                   "digest": p.engine_digest, "plan_header": p.plan.facts()},
        "baseline_engine": None if baseline is None else {
            "given_as": str(Path(str(p.baseline_engine)).resolve()),
            "bundled_as": baseline.file.rel, "digest": p.baseline_digest},
        "knob_database": p.knobs_source,
        "validation_pairs": p.validation_pairs,
        "tuning_host": "unknown: trtexec's tuning cache records no host; fingerprint.json is "
                       "an empty placeholder and describes no host",
        "not_recorded_by_trtexec": NOT_RECORDED,
    }


# ------------------------------------------------------------------------------------ export
@dataclass(frozen=True)
class Exported:
    """A trtexec tuning cache written from a dossier search."""

    path: Path
    """The file written."""
    rows: int
    """Iteration lines written."""
    winner: int | None
    """The row trtexec's rule picks (None if none passes)."""
    winner_route: str | None
    """Its route."""
    shipped_route: str | None
    """The route dossier shipped (None for an unfinished search)."""
    original: bool
    """True when the rows are trtexec's own (an imported bundle), written back unchanged."""
    loses: list[str]
    """What the export loses."""


def export_trtexec_cache(source: Path, out: Path) -> Exported:
    """Write the search of a bundle (folder or ``.dossier.tar``), run folder or dossier tuning
    cache (with ``knobs.json`` beside it) as a trtexec tuning cache at ``out``.

    The header is the original trtexec header for an imported bundle; otherwise it is made from
    the search: tuner version, metric, tolerances, threshold, strategy, every knob at its
    default (knob database order), the selection, and the model's path at tuning time;
    ``command_line`` and ``argv`` are empty (the file is for reading and auditing, not for
    ``trtexec --continue``). Rows are the baseline and search trials (confirmation
    re-measurements are left out). Raises InputError for a source that is none of these or a
    metric/strategy trtexec does not know, OutputError when ``out`` exists or cannot be
    written."""
    from dossier.bundle import open_bundle

    source = Path(source)
    if (source / MANIFEST_NAME).is_file() or (source.is_file() and source.name.endswith(".tar")):
        with open_bundle(source) as b:
            cache = b.tuning_cache()
            db = _read_db(b.file(KNOBS_NAME))
            original = None
            if ORIGINAL_CACHE in b.manifest.table():
                original = read_trtexec_cache(b.file(ORIGINAL_CACHE))[0]
            return _export(cache, db, original, out)
    cache_path = cache_file(source)
    if not cache_path.is_file():
        raise InputError(f"{source} is neither a bundle, a run folder nor a tuning cache",
                         hint="give a NAME-VERSION.dossier folder or .tar, a dossier tune --out "
                         "folder, or its tuning-cache.jsonl")
    cache = TuningCache.open(cache_path)
    knobs = cache_path.parent / KNOBS_NAME
    if not knobs.is_file():
        raise InputError(f"{cache_path.parent} has no {KNOBS_NAME}; trtexec's header needs "
                         "every knob's default", hint="export the run folder dossier tune wrote")
    return _export(cache, _read_db(knobs), None, out)


def _read_db(path: Path) -> KnobDatabase:
    try:
        return KnobDatabase.model_validate_json(path.read_bytes())
    except (OSError, ValueError) as exc:
        raise InputError(f"{path} is not a knob database ({exc})") from None


def _export(cache: TuningCache, db: KnobDatabase, original: TrtexecHeader | None,
            out: Path) -> Exported:
    h = cache.header
    header = original or make_trtexec_header(
        tuner_version=h.tuner_version, metric=h.metric, atol=h.atol, rtol=h.rtol,
        epsilon=h.threshold, strategy=h.strategy,
        default_build_route=" ".join(f"-{k.name}={k.default}" for k in db.knobs),
        tuning_expr=h.selection, onnx=h.model.path)
    records = [t for t in cache.trials if t.role != "confirm"]
    write_trtexec_cache(Path(out), header, records)
    _, its = read_trtexec_cache(Path(out))
    winner = trtexec_winner(its, header.epsilon)
    is_original = bool(records) and all(t.extra.get("source") == SOURCE for t in records)
    confirms = len(cache.trials) - len(records)
    loses = (["nothing of trtexec's rows (written back as read); the import's own findings "
              "(file hashes, the engine's digest and plan header, the derived outcomes) stay in "
              "the bundle"] if is_original else
             [x for x in EXPORT_LOSES if confirms or not x.startswith("confirmation")])
    decision = cache.decision
    return Exported(path=Path(out), rows=len(its), winner=winner,
                    winner_route=None if winner is None else Route.parse(
                        its[winner].build_route).text(),
                    shipped_route=decision.shipped_route if decision else None,
                    original=is_original, loses=loses)


__all__ = ["EXPORT_LOSES", "Exported", "IMPORT_RECORD", "NOT_RECORDED", "ORIGINAL_CACHE",
           "RULE", "export_trtexec_cache", "import_trtexec", "unknown_fingerprint"]
