"""Write a bundle from a finished run folder.

The bundle is staged in a folder next to the target (``DIR/.NAME-VERSION.dossier.staging-*``,
same file system), every file is written, fsynced and hashed as it is written, the manifest is
written last, and the staging folder is renamed into place without replacing anything. A killed
writer leaves only a staging folder, which the next write to the same folder removes; no
half-written bundle is ever visible at ``DIR/NAME-VERSION.dossier``.
"""

from __future__ import annotations

import datetime as dt
import json
import math
import os
import re
import shutil
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from pydantic import ValidationError

from dossier import __version__
from dossier.bundle import tables
from dossier.bundle._files import (
    begin_staging,
    copy_file_hashed,
    fsync_path,
    fsync_tree,
    rename_noreplace,
    write_durable,
)
from dossier.bundle.manifest import (
    BUNDLE_SUFFIX,
    CACHE_NAME,
    FINGERPRINT_NAME,
    FORMAT_VERSION,
    KNOBS_NAME,
    MANIFEST_NAME,
    MODEL_JSON,
    VALIDATION_JSON,
    EngineEntry,
    Engines,
    ExternalFile,
    FileEntry,
    Manifest,
    ModelIdentity,
    Summary,
    ValidationInfo,
    manifest_bytes,
    seal,
)
from dossier.bundle.model import external_locations
from dossier.cache import CacheHeader, DecisionRecord, TuningCache
from dossier.cache_check import check_cache
from dossier.diskfull import disk_full_error, is_disk_full
from dossier.errors import (
    InputError,
    ModelError,
    OutputError,
    SelectionError,
    TuneError,
    ValidationSetError,
)
from dossier.hashing import digest_file
from dossier.knobs import KnobDatabase
from dossier.lock import bundle_lock, run_folder_lock
from dossier.routes import Route, Selection
from dossier.spec import ShapeEntry
from dossier.trial import TrialRecord
from dossier.validation import ValidationSet, load_validation_set

_ID = re.compile(r"^[0-9a-f]{32}$")


@dataclass(frozen=True)
class WrittenBundle:
    """A bundle just written."""

    path: Path
    """The bundle folder ``DIR/NAME-VERSION.dossier``."""
    manifest: Manifest
    """Its manifest."""


def bundle_name(release: str, version: int) -> str:
    """``NAME-VERSION.dossier``."""
    return f"{release}-{version}{BUNDLE_SUFFIX}"


def check_target(out_dir: Path, release: str, version: int) -> Path:
    """The bundle folder a release would be written to; OutputError when it exists or when
    ``out_dir`` holds the same release at a version as high or higher. Writes nothing."""
    out_dir = Path(out_dir)
    target = out_dir / bundle_name(release, version)
    if os.path.lexists(target):
        raise OutputError(f"{target} exists already",
                          hint="bundles are never overwritten; raise the release version")
    pattern = re.compile(rf"^{re.escape(release)}-(\d+)(\.dossier|\.dossier\.tar)$")
    try:
        names = sorted(p.name for p in out_dir.iterdir()) if out_dir.is_dir() else []
    except OSError as exc:
        raise OutputError(f"cannot list {out_dir}: {exc.strerror}") from exc
    held = [(int(m[1]), n) for n in names if (m := pattern.match(n))]
    newer = [(v, n) for v, n in held if v >= version]
    if newer:
        v, _ = max(newer)
        raise OutputError(f"release versions must increase; {out_dir} holds {release}-{v}",
                          hint=f"set [release] version above {v} in the release spec")
    return target


def write_bundle(source: Path, out_dir: Path, *, parent: str | None = None,
                 include_model: bool = True) -> WrittenBundle:
    """Bundle the finished search in ``source`` (a run folder or its tuning-cache.jsonl) as
    ``out_dir/NAME-VERSION.dossier``. ``parent`` defaults to the one the cache header records
    (a re-tune's), else None.

    Everything is checked before anything is written: the search has decided, the engines,
    knob database, fingerprint, model and validation set are there and match what the tuning
    cache recorded. Raises TuneError for an unfinished search, InputError (or a subclass) for
    a run folder that does not match its cache, OutputError when the target exists or the
    release version does not increase.
    """
    source = Path(source)
    cache_path = source / CACHE_NAME if source.is_dir() else source
    if not cache_path.is_file():
        raise InputError(f"{source} is neither a run folder nor a tuning cache",
                         hint="give the --out folder of dossier tune, or its tuning-cache.jsonl")
    cache = TuningCache.open(cache_path)  # the header, to name the target
    if parent is None:  # a re-tune records the bundle it started from in the cache header
        parent = getattr(cache.header, "parent", None)
    if parent is not None and not _ID.match(parent):
        raise InputError(f"--parent {parent!r} is not a dossier id (32 hex digits)",
                         hint="dossier inspect PARENT_BUNDLE shows its id")
    h = cache.header
    out_dir = Path(out_dir)
    target = check_target(out_dir, h.release, h.release_version)
    with run_folder_lock(cache_path.parent, read_only_ok=True):
        cache = TuningCache.open(cache_path)  # again, now that no search can append to it
        decision = cache.decision
        if decision is None:
            raise TuneError(f"{cache_path}: the search has not finished; dossier tune --continue it")
        with bundle_lock(out_dir, target.name):
            plan = _Plan.make(cache, decision, cache_path.parent, include_model)
            return commit_bundle(out_dir, target, lambda staging: plan.write(staging, parent))


def commit_bundle(out_dir: Path, target: Path,
                  fill: Callable[[Path], Manifest]) -> WrittenBundle:
    """Write a bundle folder atomically: ``fill(staging)`` writes every file into a staging
    folder next to ``target`` (the manifest last) and returns the manifest; the folder is then
    fsynced and renamed into place without replacing anything. A staging folder left by a
    killed writer in ``out_dir`` is removed first; on any failure the staging folder goes.
    OutputError when ``out_dir`` cannot be written or ``target`` appeared meanwhile."""
    out_dir = Path(out_dir)
    staging = begin_staging(out_dir, target.name, directory=True)
    try:
        manifest = fill(staging)
        fsync_tree(staging)
        try:
            rename_noreplace(staging, target)
        except FileExistsError:
            raise OutputError(f"{target} appeared while the bundle was written",
                              hint="another dossier wrote the same release") from None
        fsync_path(out_dir)
    except OSError as exc:
        shutil.rmtree(staging, ignore_errors=True)
        if is_disk_full(exc):
            raise disk_full_error(exc, out_dir, f"writing {target.name}") from exc
        raise OutputError(f"cannot write the bundle into {out_dir}: {exc.strerror or exc}") from exc
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return WrittenBundle(target, manifest)


@dataclass
class _Plan:
    """Everything a bundle is made of, checked before writing starts."""

    cache: TuningCache
    decision: DecisionRecord
    run_dir: Path
    include_model: bool
    db: KnobDatabase
    shipped: TrialRecord
    baseline: TrialRecord
    model: Path
    externals: list[str]
    vset: ValidationSet

    @classmethod
    def make(cls, cache: TuningCache, decision: DecisionRecord, run_dir: Path,
             include_model: bool) -> _Plan:
        h = cache.header
        for name in (KNOBS_NAME, FINGERPRINT_NAME):
            if not (run_dir / name).is_file():
                raise InputError(f"run folder {run_dir} has no {name}",
                                 hint="bundle the folder dossier tune wrote, unchanged")
        try:
            db = KnobDatabase.model_validate_json((run_dir / KNOBS_NAME).read_bytes())
        except ValidationError as exc:
            raise InputError(f"{run_dir / KNOBS_NAME} is not a knob database") from exc
        if db.digest() != h.knob_db_digest:
            raise InputError(f"{run_dir / KNOBS_NAME} is not the knob database the search used")
        try:
            vset = load_validation_set(Path(h.validation_path))
        except ValidationSetError as exc:
            raise ValidationSetError(f"the validation set of the search cannot be read: {exc}",
                                     hint="restore it where the search found it") from exc
        if vset.digest() != h.validation_digest:
            raise ValidationSetError(f"the validation set {h.validation_path} changed since the "
                                     "search", hint="restore it, or tune again")
        check_cache(cache, db, run_dir, vset=vset)  # every record, every engine digest
        trials = {t.index: t for t in cache.trials}
        shipped = trials.get(decision.shipped_index)
        baseline = next((t for t in cache.trials if t.role == "baseline"), None)
        if shipped is None or baseline is None:
            raise InputError(f"{cache.path}: the decision names trial {decision.shipped_index}, "
                             "which the cache does not hold")
        for t in (shipped, baseline):
            if not t.engine or not (run_dir / t.engine).is_file():
                raise InputError(f"the engine of trial {t.index} ({t.route or 'default route'}) "
                                 f"is missing from {run_dir}",
                                 hint="bundle the run folder dossier tune wrote, unchanged")
        model = Path(h.model.path)
        externals: list[str] = []
        if model.is_file():
            externals = external_locations(model)
        elif include_model:
            raise ModelError(f"the model {model} is gone",
                             hint="restore it, or bundle with --no-model")
        return cls(cache, decision, run_dir, include_model, db, shipped, baseline, model,
                   externals, vset)

    # -------------------------------------------------------------------------------- write
    def write(self, staging: Path, parent: str | None) -> Manifest:
        """Write every file into ``staging``, the manifest last; return the manifest."""
        h = self.cache.header
        files: list[FileEntry] = []

        def add(rel: str, digest: str, size: int) -> FileEntry:
            entry = FileEntry(path=rel, size=size, digest=digest)
            files.append(entry)
            return entry

        def copy(src: Path, rel: str) -> FileEntry:
            dst = staging / rel
            dst.parent.mkdir(parents=True, exist_ok=True)
            return add(rel, *copy_file_hashed(src, dst))

        def put(rel: str, data: bytes) -> None:
            dst = staging / rel
            dst.parent.mkdir(parents=True, exist_ok=True)
            write_durable(dst, data)
            add(rel, *digest_file(dst))

        engines = self._write_engines(copy)
        identity = self._write_model(copy)
        put(MODEL_JSON, _json_bytes(identity.model_dump(mode="json")))
        for name in (KNOBS_NAME, FINGERPRINT_NAME, CACHE_NAME):
            src = self.cache.path if name == CACHE_NAME else self.run_dir / name
            copy(src, name)
        info = self._write_validation(copy)
        put(VALIDATION_JSON, _json_bytes(info.model_dump(mode="json")))
        knobs = [i.knob for i in Selection.parse(h.selection, self.db).items]
        trials = self.cache.trials
        for rel, table in ((tables.ROUTES, tables.routes_table(trials, knobs, self.db,
                                                                self.decision.shipped_index)),
                           (tables.TIMINGS, tables.timings_table(trials)),
                           (tables.SHAPES, tables.shapes_table(h.shapes))):
            tables.write_table(table, staging / rel)
            add(rel, *digest_file(staging / rel))
        manifest = seal(Manifest(
            format_version=FORMAT_VERSION, dossier_id="0" * 32, release=h.release,
            release_version=h.release_version, description=h.description, parent=parent,
            created_at=_finished_at(self.cache), tool_version=__version__, backend=h.backend,
            tuner_version=h.tuner_version, knob_db_digest=h.knob_db_digest, model=identity,
            model_included=self.include_model, engines=engines, summary=self._summary(),
            tuning_host=dict(h.host), warnings=self._warnings(),
            files=sorted(files, key=lambda f: f.path)))
        write_durable(staging / MANIFEST_NAME, manifest_bytes(manifest))
        return manifest

    def _write_engines(self, copy) -> Engines:  # type: ignore[no-untyped-def]
        name = self.cache.header.release
        backend_flags = _flag_source(self.cache.header.backend, self.db)
        load = _load_source(self.cache.header.backend, self.db)
        entries = {}
        for role, trial in (("shipped", self.shipped), ("baseline", self.baseline)):
            if role == "baseline" and trial.index == self.shipped.index:
                entries[role] = entries["shipped"]
                continue
            src = self.run_dir / trial.engine  # type: ignore[operator]
            tag = "" if role == "shipped" else ".baseline"
            f = copy(src, f"engine/{name}{tag}{src.suffix}")
            if f.digest != trial.engine_digest:
                raise InputError(f"engine {src} changed since the search (its xxh3-128 is not "
                                 "the one the tuning cache recorded)",
                                 hint="bundle the run folder dossier tune wrote, unchanged")
            entries[role] = EngineEntry(path=f.path, route=trial.route, trial_index=trial.index,
                                        size=f.size, digest=f.digest, facts=dict(trial.extra),
                                        flags=backend_flags(trial.route),
                                        load=load(trial.route))
        return Engines(**entries)

    def _write_model(self, copy) -> ModelIdentity:  # type: ignore[no-untyped-def]
        h = self.cache.header
        if not self.model.is_file():  # --no-model, and the model is not at hand any more
            return ModelIdentity(file_name=Path(h.model.path).name, size=h.model.size,
                                 digest=h.model.digest, external_data_known=False)
        if self.include_model:
            f = copy(self.model, f"model/{self.model.name}")
            digest, size = f.digest, f.size
        else:
            digest, size = digest_file(self.model)
        if digest != h.model.digest:
            raise ModelError(f"the model {self.model} changed since the search",
                             hint="restore the model the search tuned, or tune again")
        external = []
        for location in self.externals:
            src = self.model.parent / location
            if not src.is_file():
                raise ModelError(f"{self.model}: external data file {location} is missing")
            if self.include_model:
                f = copy(src, f"model/{location}")
                d, s = f.digest, f.size
            else:
                d, s = digest_file(src)
            external.append(ExternalFile(path=location, size=s, digest=d))
        return ModelIdentity(file_name=self.model.name, size=size, digest=digest,
                             external_data=external)

    def _write_validation(self, copy) -> ValidationInfo:  # type: ignore[no-untyped-def]
        h = self.cache.header
        root = self.vset.path
        for pair in self.vset.pairs:
            for role in ("inputs", "references"):
                copy(root / pair.name / f"{role}.arrow", f"validation/{pair.name}/{role}.arrow")
        provenance = None
        if (root / "provenance.json").is_file():
            provenance = copy(root / "provenance.json", "validation/provenance.json").path
        method = self.vset.provenance.get("method") if isinstance(self.vset.provenance, dict) \
            else None
        return ValidationInfo(
            metric=h.metric, threshold=h.threshold, atol=h.atol, rtol=h.rtol,
            pairs=[p.name for p in self.vset.pairs],
            pair_inputs={p.name: {k: [int(d) for d in v.shape] for k, v in sorted(p.inputs.items())}
                         for p in self.vset.pairs},
            digest=h.validation_digest,
            references=str(method) if method else "unknown", provenance=provenance)

    def _summary(self) -> Summary:
        h, d = self.cache.header, self.decision
        counts: dict[str, int] = {}
        for t in self.cache.trials:
            if t.role != "confirm":
                counts[t.outcome.value] = counts.get(t.outcome.value, 0) + 1
        if d.gain and d.speedup is not None:
            result = (f"{d.speedup:.3f}x [{d.speedup_ci_low:.3f}, {d.speedup_ci_high:.3f}] "
                      f"(p={d.p_value:.2g})")
        else:
            result = "no significant gain"
        return Summary(
            strategy=h.strategy, selection=h.selection, metric=h.metric, threshold=h.threshold,
            atol=h.atol, rtol=h.rtol, validation_pairs=h.validation_pairs,
            baseline_route=d.baseline_route, baseline_timing=self.baseline.timing,
            shipped_route=d.shipped_route, shipped_index=d.shipped_index, gain=d.gain,
            speedup=_finite(d.speedup), speedup_ci_low=_finite(d.speedup_ci_low),
            speedup_ci_high=_finite(d.speedup_ci_high), confidence=h.timing.confidence,
            p_value=_finite(d.p_value), result=result, reason=d.reason, decision_rule=d.rule,
            aa=d.aa, confirm_aa=d.confirm_aa,
            runner_up_route=d.runner_up_route, runner_up_speedup=_finite(d.runner_up_speedup),
            trial_counts=dict(sorted(counts.items())),
            confirm_trials=sum(t.role == "confirm" for t in self.cache.trials),
            search_wall_s=sum(s.wall_s for s in self.cache.sessions),
            build_s_total=sum(t.build_s or 0.0 for t in self.cache.trials),
            sessions=len(self.cache.sessions))

    def _warnings(self) -> list[str]:
        pairs = {p.name: {k: list(v.shape) for k, v in p.inputs.items()} for p in self.vset.pairs}
        return coverage_warnings(pairs, self.cache.header.shapes)


def coverage_warnings(pair_inputs: Mapping[str, Mapping[str, Sequence[int]]],
                      shapes: Sequence[ShapeEntry]) -> list[str]:
    """What is questionable about a validation set for a shape distribution.

    Warns when there are fewer than two pairs, and when the shape entries with the smallest and
    the largest element count (summed over the inputs) do not each appear as the input shapes of
    some pair.
    """
    out = []
    if len(pair_inputs) < 2:
        out.append(f"the validation set has {len(pair_inputs)} pair(s); accuracy rests on "
                   "fewer than two examples")
    if not shapes:
        return out
    seen = [{k: [int(d) for d in v] for k, v in p.items()} for p in pair_inputs.values()]

    def elements(e: ShapeEntry) -> int:
        return sum(math.prod(dims) for dims in e.inputs.values())

    ordered = sorted(range(len(shapes)), key=lambda i: (elements(shapes[i]), i))
    extremes = [("smallest", ordered[0]), ("largest", ordered[-1])]
    for label, i in extremes if ordered[0] != ordered[-1] else extremes[:1]:
        entry = shapes[i]
        want = {k: list(v) for k, v in entry.inputs.items()}
        if not any(all(p.get(k) == v for k, v in want.items()) for p in seen):
            text = ", ".join(f"{k}={v}" for k, v in sorted(want.items()))
            out.append(f"no validation pair covers the {label} shape entry #{i} ({text}); "
                       "accuracy at that size is unchecked")
    return out


def _load_source(backend: str, db: KnobDatabase):  # type: ignore[no-untyped-def]
    """Production load configuration by route; None for a backend this host does not
    register."""
    from dossier.backends import get_backend

    try:
        impl = get_backend(backend)
    except SelectionError:
        return lambda route: None
    return lambda route: impl.production_load(Route.parse(route), db)


def _flag_source(backend: str, db: KnobDatabase):  # type: ignore[no-untyped-def]
    """Engine flags by route; none for a backend this host does not register."""
    from dossier.backends import get_backend

    try:
        impl = get_backend(backend)
    except SelectionError:
        return lambda route: {}

    def flags(route: str) -> dict[str, bool]:
        return dict(impl.engine_facts(Route.parse(route), db))

    return flags


def _finished_at(cache: TuningCache) -> str:
    """When the search finished: the end of its last session (the header's time if none), so
    bundling the same run twice gives the same bundle."""
    if not cache.sessions:
        return cache.header.created_at
    last = cache.sessions[-1]
    try:
        start = dt.datetime.fromisoformat(last.started_at)
    except ValueError:
        return last.started_at
    return (start + dt.timedelta(seconds=round(last.wall_s))).isoformat(timespec="seconds")


def _finite(x: float | None) -> float | None:
    return x if x is not None and math.isfinite(x) else None


def _json_bytes(data: object) -> bytes:
    return (json.dumps(data, indent=2, sort_keys=True, allow_nan=False) + "\n").encode()


def header_of(source: Path) -> CacheHeader:
    """The tuning cache header of a run folder or cache file."""
    source = Path(source)
    return TuningCache.open(source / CACHE_NAME if source.is_dir() else source).header
