"""Bundle a finished run folder: check it against its tuning cache and describe it as a
:class:`~dossier.bundle.builder.BundleContent`, which :func:`~dossier.bundle.builder.build_bundle`
writes (staged, fsynced, renamed into place).
"""

from __future__ import annotations

import datetime as dt
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from pydantic import ValidationError

from dossier.bundle.builder import (
    BundleContent,
    Copy,
    Data,
    EngineFile,
    ModelFiles,
    Table,
    WrittenBundle,
    build_bundle,
    bundle_name,
    check_target,
    json_bytes,
    trial_counts,
    trial_tables,
)
from dossier.bundle.manifest import (
    ARCHIVE_SUFFIX,
    BUNDLE_SUFFIX,
    MODEL_JSON,
    VALIDATION_JSON,
    ModelIdentity,
    Summary,
    ValidationInfo,
)
from dossier.bundle.model import external_locations
from dossier.cache import CacheHeader, DecisionRecord, TuningCache
from dossier.cache_check import check_cache
from dossier.datasets import (
    decision_result,
    load_calibration_set,
    no_holdout_warning,
    numeric_changes,
)
from dossier.errors import (
    InputError,
    ModelError,
    TuneError,
    ValidationSetError,
)
from dossier.knobs import KnobDatabase
from dossier.load_config import LoadConfig
from dossier.lock import bundle_lock, run_folder_lock
from dossier.routes import Selection
from dossier.run_folder import (
    CACHE_NAME,
    FINGERPRINT_NAME,
    KNOBS_NAME,
    cache_file,
    scenario_files,
)
from dossier.spec import ShapeEntry
from dossier.trial import Shipped, TrialRecord
from dossier.validation import ValidationSet, load_validation_set

_ID = re.compile(r"^[0-9a-f]{32}$")


class Describer(Protocol):
    """What the writer asks of the run's backend (the bundle layer imports no backend: its
    callers pass :mod:`dossier.backends.describe`)."""

    def recorded_load(self, backend: str, db: KnobDatabase, route: str
                      ) -> tuple[LoadConfig | None, dict[str, bool]]:
        """The load configuration and engine flags of a trial recorded before runs recorded
        them (run folders older than format 1.1)."""

    def engine_documents(self, backend: str, engine: Path) -> dict[str, bytes]:
        """Documents read out of an engine for a reviewer (``quantization.json``)."""


def write_bundle(source: Path, out_dir: Path, *, parent: str | None = None,
                 include_model: bool = True, describe: Describer | None = None
                 ) -> WrittenBundle:
    """Bundle the finished search in ``source`` (a run folder or its tuning-cache.jsonl) as
    ``out_dir/NAME-VERSION.dossier``. ``parent`` defaults to the one the cache header records
    (a re-tune's), else None.

    Everything is checked before anything is written: the search has decided, the engines,
    knob database, fingerprint, model and validation set are there and match what the tuning
    cache recorded. Raises TuneError for an unfinished search, InputError (or a subclass) for
    a run folder that does not match its cache, OutputError when the target exists or the
    release version does not increase. ``describe`` asks the backend what the run did not
    record (without it: no engine documents, and a run older than format 1.1 is refused).
    """
    source = Path(source)
    cache_path = cache_file(source)
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
            plan = _Plan.make(cache, decision, cache_path.parent, include_model, describe)
            return build_bundle(plan.content(parent), out_dir)


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
    describe: Describer | None

    @classmethod
    def make(cls, cache: TuningCache, decision: DecisionRecord, run_dir: Path,
             include_model: bool, describe: Describer | None) -> _Plan:
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
                   externals, vset, describe)

    # ------------------------------------------------------------------------------ content
    def content(self, parent: str | None) -> BundleContent:
        """The bundle's content: what the run folder holds, as the tuning cache recorded it."""
        h = self.cache.header
        files: list[Copy | Data | Table] = [
            Copy(self.cache.path if name == CACHE_NAME else self.run_dir / name, name)
            for name in (KNOBS_NAME, FINGERPRINT_NAME, CACHE_NAME)]
        files += self._validation()
        files += self._data_sets()
        files += [Copy(src, rel) for src, rel in scenario_files(self.run_dir)]  # its LoadGen logs
        knobs = [i.knob for i in Selection.parse(h.selection, self.db).items]
        trials = self.cache.trials
        files += trial_tables(trials, knobs, self.db, self.decision.shipped_index, h.shapes)
        model: ModelFiles | ModelIdentity
        if self.model.is_file():
            model = ModelFiles(self.model, self.include_model, self.externals, h.model.digest,
                               ModelError(f"the model {self.model} changed since the search",
                                          hint="restore the model the search tuned, or tune "
                                          "again"))
        else:  # --no-model, and the model is not at hand any more
            model = ModelIdentity(file_name=Path(h.model.path).name, size=h.model.size,
                                  digest=h.model.digest, external_data_known=False)
        shipped = self._engine(self.shipped, "")
        return BundleContent(
            release=h.release, release_version=h.release_version, description=h.description,
            parent=parent, created_at=_finished_at(self.cache), backend=h.backend,
            tuner_version=h.tuner_version, knob_db_digest=h.knob_db_digest,
            summary=self._summary(), shipped=shipped,
            baseline=None if self.baseline.index == self.shipped.index
            else self._engine(self.baseline, ".baseline"),
            baseline_is_shipped=self.baseline.index == self.shipped.index, model=model,
            files=files, tuning_host=dict(h.host), warnings=self._warnings())

    def _engine(self, trial: TrialRecord, tag: str) -> EngineFile:
        h = self.cache.header
        src = self.run_dir / str(trial.engine)
        changed = InputError(f"engine {src} changed since the search (its xxh3-128 is not the "
                             "one the tuning cache recorded)",
                             hint="bundle the run folder dossier tune wrote, unchanged")
        load, flags = trial.load, trial.engine_flags
        if load is None or flags is None:  # recorded before the search recorded them
            if self.describe is None:
                raise InputError(f"trial {trial.index} of {self.run_dir} was recorded before "
                                 "runs recorded their load configuration (format 1.1)",
                                 hint="bundle it with the dossier command, which asks the "
                                      "backend for it")
            load, flags = self.describe.recorded_load(h.backend, self.db, trial.route)
        return EngineFile(Copy(src, f"engine/{h.release}{tag}{src.suffix}", trial.engine_digest,
                               changed),
                          route=trial.route, trial_index=trial.index, facts=dict(trial.extra),
                          flags=dict(flags), load=load)

    def _validation(self) -> list[Copy | Data | Table]:
        h = self.cache.header
        root = self.vset.path
        files: list[Copy | Data | Table] = [
            Copy(root / pair.name / f"{role}.arrow", f"validation/{pair.name}/{role}.arrow")
            for pair in self.vset.pairs for role in ("inputs", "references")]
        provenance = None
        if (root / "provenance.json").is_file():
            provenance = "validation/provenance.json"
            files.append(Copy(root / "provenance.json", provenance))
        method = self.vset.provenance.get("method") if isinstance(self.vset.provenance, dict) \
            else None
        info = ValidationInfo(
            metric=h.metric, threshold=h.threshold, atol=h.atol, rtol=h.rtol,
            pairs=[p.name for p in self.vset.pairs],
            pair_inputs={p.name: {k: [int(d) for d in v.shape] for k, v in sorted(p.inputs.items())}
                         for p in self.vset.pairs},
            digest=h.validation_digest,
            references=str(method) if method else "unknown", provenance=provenance)
        files.append(Data(VALIDATION_JSON, json_bytes(info.model_dump(mode="json"))))
        return files

    def _data_sets(self) -> list[Copy | Data | Table]:
        """The calibration and hold-out sets (``calibration/``, ``holdout/``), what the search
        recorded of them (``datasets.json``: role, digest, size, and the shipped route's
        hold-out check), and what the shipped engine says of its quantization."""
        h = self.cache.header
        files: list[Copy | Data | Table] = []
        sets = [i for i in (h.calibration, h.holdout) if i is not None]
        for ident in sets:
            root = Path(ident.path)
            data = load_calibration_set(root) if ident.role == "calibration" \
                else load_validation_set(root)
            if data.digest() != ident.digest:
                raise ValidationSetError(f"the {ident.role} set {root} changed since the search",
                                         hint="restore it, or tune again")
            if isinstance(data, ValidationSet):
                files += [Copy(root / p.name / f"{role}.arrow", f"holdout/{p.name}/{role}.arrow")
                          for p in data.pairs for role in ("inputs", "references")]
            else:
                files += [Copy(root / name / "inputs.arrow", f"calibration/{name}/inputs.arrow")
                          for name, _ in data.samples]
        engine = self.run_dir / str(self.shipped.engine)
        # only a transformed engine has documents to read out (no backend asked otherwise)
        docs = self.describe.engine_documents(h.backend, engine) \
            if self.describe is not None \
            and self.shipped.extra.get("quantization", "none") != "none" else {}
        files += [Data(f"engine/{name}", data) for name, data in sorted(docs.items())]
        if sets or docs:
            # the bundle's own folder names each set (the tuning host's paths stay behind)
            record = {"sets": [{**i.model_dump(mode="json"),
                                "path": "holdout" if i.role == "holdout" else "calibration"}
                               for i in sets],
                      "holdout_check": self.decision.holdout.model_dump(mode="json")
                      if self.decision.holdout else None,
                      "holdout_rejected": self.decision.holdout_rejected,
                      "engine_documents": [f"engine/{n}" for n in sorted(docs)]}
            files.append(Data(DATASETS_JSON, json_bytes(record)))
        return files

    def _summary(self) -> Summary:
        h, d = self.cache.header, self.decision
        result = decision_result(d)
        return Summary(
            strategy=h.strategy, selection=h.selection, metric=h.metric, threshold=h.threshold,
            atol=h.atol, rtol=h.rtol, validation_pairs=h.validation_pairs,
            inferences_per_sample=h.per_sample, baseline_timing=self.baseline.timing,
            **{k: getattr(d, k) for k in Shipped.model_fields},
            speedup=_finite(d.speedup), speedup_ci_low=_finite(d.speedup_ci_low),
            speedup_ci_high=_finite(d.speedup_ci_high), confidence=h.timing.confidence,
            p_value=_finite(d.p_value), result=result, reason=d.reason, decision_rule=d.rule,
            aa=d.aa, confirm_aa=d.confirm_aa,
            runner_up_route=d.runner_up_route, runner_up_speedup=_finite(d.runner_up_speedup),
            trial_counts=trial_counts(self.cache.trials),
            confirm_trials=sum(t.role == "confirm" for t in self.cache.trials),
            search_wall_s=sum(s.wall_s for s in self.cache.sessions),
            build_s_total=sum(t.build_s or 0.0 for t in self.cache.trials),
            sessions=len(self.cache.sessions))

    def _warnings(self) -> list[str]:
        pairs = {p.name: {k: list(v.shape) for k, v in p.inputs.items()} for p in self.vset.pairs}
        out = coverage_warnings(pairs, self.cache.header.shapes)
        d = self.decision
        changes = numeric_changes(d.shipped_route, d.baseline_route, self.db)
        if changes and self.cache.header.holdout is None:
            out.append(no_holdout_warning(changes))
        return out


DATASETS_JSON = "datasets.json"
"""The calibration and hold-out sets a bundle carries, and the shipped route's hold-out check."""


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


def header_of(source: Path) -> CacheHeader:
    """The tuning cache header of a run folder or cache file."""
    source = Path(source)
    return TuningCache.open(cache_file(source)).header


__all__ = ["ARCHIVE_SUFFIX", "BUNDLE_SUFFIX", "CACHE_NAME", "FINGERPRINT_NAME", "KNOBS_NAME",
           "MODEL_JSON", "VALIDATION_JSON", "WrittenBundle", "bundle_name", "check_target",
           "coverage_warnings", "header_of", "write_bundle"]
