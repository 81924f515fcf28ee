"""What a reviewer wants first about a bundle: :class:`Overview` (``dossier inspect``).

Read from the manifest and the records (the shipped route's per-output losses, its load hint);
never from an engine. The model is what ``inspect --json`` prints and what every output format
of ``inspect`` renders (see :mod:`dossier.formats`); its schema is
``schemas/bundle-overview.schema.json``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pydantic import BaseModel, ConfigDict

from dossier.load_config import LoadConfig
from dossier.measure.conditions import Summary as ConditionsSummary
from dossier.measure.latency import RouteLatency
from dossier.run_folder import CACHE_NAME
from dossier.trial import Reading, TrialRecord

if TYPE_CHECKING:
    from dossier.bundle.reader import Bundle  # the reader imports nothing of this module
    from dossier.cache import DecisionRecord
    from dossier.measure.target import TargetConditions


class _Model(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class ModelFacts(_Model):
    """The model the engines were built from, by identity."""

    file_name: str
    """Its file name."""
    size: int
    """Its size in bytes."""
    digest: str
    """Its digest (``algorithm``)."""
    algorithm: str
    """The digest's algorithm (xxh3-128)."""
    external_data: int
    """How many external data files it has."""
    included: bool
    """The model file is in the bundle (``bundle --no-model`` leaves it out)."""


class BaselineFacts(_Model):
    """The baseline route and its screening trial's timed samples. A sample is
    ``inferences_per_sample`` inferences, not one: the per-inference figures are
    ``Overview.baseline_latency``."""

    route: str
    """The baseline route ("" is the backend's default route)."""
    trial_index: int
    """Its trial (0 when the bundle has no baseline engine)."""
    inferences_per_sample: int
    """Inferences in one timed sample (one per input shape, or a pass over every validation
    pair in bundles from before ``[timing] inputs``)."""
    sample_median_ms: float | None
    """Its screening trial's median time of one timed sample (``inferences_per_sample``
    inferences); None when not timed (a trtexec import)."""
    sample_ci_low_ms: float | None
    """Lower end of that median's interval (one sample)."""
    sample_ci_high_ms: float | None
    """Upper end (one sample)."""
    samples: int | None
    """Timed samples."""


class WinnerFacts(_Model):
    """The shipped route."""

    route: str
    """The route whose engine ships."""
    trial_index: int
    """Its trial."""
    engine: str
    """The engine file, relative to the bundle."""
    is_baseline: bool
    """The baseline's engine ships (there was no significant gain)."""


class SpeedupFacts(_Model):
    """The shipped route's speedup over the baseline, with its interval."""

    value: float
    """Baseline latency over shipped latency."""
    ci_low: float | None
    """Lower end of its interval."""
    ci_high: float | None
    """Upper end."""
    confidence: float
    """Confidence level of the interval."""
    p_value: float | None
    """The test's p-value."""


class RunnerUpFacts(_Model):
    """The next-best admissible route."""

    route: str
    """Its route."""
    speedup: float | None
    """Its speedup over the baseline (None: not timed)."""


class OutputWorst(_Model):
    """The shipped route's worst loss of one output tensor over the validation pairs."""

    output: str
    """Output tensor."""
    loss: float | None
    """The largest loss (None: the output held NaN or Inf)."""
    pair: str
    """The pair it came from."""


class DataSetFacts(_Model):
    """One data set of the release, by identity."""

    role: str
    """``validation``, ``holdout`` or ``calibration``."""
    size: int
    """Pairs (validation, hold-out) or samples (calibration)."""
    digest: str | None
    """Its xxh3-128 over its tensors (None: not recorded)."""
    in_bundle: str | None
    """The bundle folder that carries it (None: the bundle does not)."""


class HoldoutFacts(_Model):
    """The shipped route's check on the hold-out set."""

    route: str
    """The route checked (the shipped one)."""
    passed: bool
    """Every loss of every hold-out pair below the threshold, no NaN or Inf."""
    worst_loss: float | None
    """Its largest loss on the hold-out set (None: none finite, or not validated)."""
    pairs: int
    """Hold-out pairs."""
    reason: str | None
    """Why it failed."""
    rejected: list[str]
    """Routes confirmed faster that failed the hold-out set, and so did not ship."""


class Overview(_Model):
    """What a reviewer wants first: ``dossier inspect --json``."""

    bundle: str
    """What was opened: the bundle folder or its .dossier.tar."""
    release: str
    """Release name."""
    version: int
    """Release version."""
    description: str
    """The release's description."""
    dossier_id: str
    """The bundle's id (xxh3-128 of its manifest)."""
    parent: str | None
    """The dossier id of the release this one replaces."""
    created_at: str
    """When the bundle was written (UTC, ISO 8601)."""
    format_version: str
    """The bundle's format version (MAJOR.MINOR)."""
    tool_version: str
    """The dossier version that wrote it."""
    backend: str
    """Compiler backend."""
    tuner_version: str
    """The backend's compiler version at tune time."""
    model: ModelFacts
    """The model, by identity."""
    strategy: str
    """Search strategy."""
    selection: str
    """The knob selection searched."""
    metric: str
    """Accuracy metric."""
    threshold: float
    """Accuracy threshold: the metric must be below it on every output of every pair."""
    atol: float
    """Absolute tolerance (the l0 metric)."""
    rtol: float
    """Relative tolerance (the l0 metric)."""
    validation_pairs: int
    """Validation pairs."""
    engine_version: str | None
    """The shipped plan's TensorRT version (None for other backends)."""
    baseline: BaselineFacts
    """The baseline route."""
    winner: WinnerFacts
    """The shipped route."""
    baseline_engine: bool
    """The bundle carries the baseline's engine (a trtexec import does not)."""
    gain: bool
    """A route other than the baseline ships."""
    speedup: SpeedupFacts | None
    """The shipped route's speedup; None without a gain or when not statistically checked."""
    result: str
    """The result in words (the speedup, or "no significant gain")."""
    reason: str
    """Why this route ships."""
    decision_rule: str
    """The decision rule applied."""
    runner_up: RunnerUpFacts | None
    """The next-best admissible route."""
    accuracy_by_output: list[OutputWorst] | None
    """The shipped route's worst loss per output; None when the records have none."""
    aa: Reading | None
    """The baseline's A/A check, as the decision recorded it."""
    confirm_aa: Reading | None
    """The confirmation's A/A check."""
    load: LoadConfig | None
    """How to load the shipped engine as it was timed, without dossier."""
    trials: dict[str, int]
    """Baseline and search trials per outcome."""
    confirm_trials: int
    """Confirmation re-measurements."""
    search_wall_s: float | None
    """Wall time of the search; None when not recorded (a trtexec import)."""
    build_s_total: float | None
    """Build time summed over the trials; None when not recorded."""
    warnings: list[str]
    """Warnings recorded in the manifest."""
    notes: list[str]
    """What the reader wants said (a newer minor format, how to load the engine)."""
    tuning_host: dict[str, str]
    """The tuning host, in brief (the manifest's ``tuning_host``)."""
    shipped_latency: RouteLatency | None = None
    """The shipped route's latency per inference: the confirmation's reading where it
    measured the route, else its screening trial's (``source`` says which); None when not
    timed."""
    baseline_latency: RouteLatency | None = None
    """The baseline's, the same way."""
    conditions: ConditionsSummary | None = None
    """What the host was doing while the decision was measured (the confirmation's measuring
    processes, or without a confirmation the search trials); None in bundles that did not
    record it."""
    conditions_of: str | None = None
    """``confirmation`` or ``search``: whose measurements ``conditions`` summarises."""
    data_sets: list[DataSetFacts] = []
    """The validation, hold-out and calibration sets, each with its size and digest (empty
    when the search record cannot be read)."""
    holdout_check: HoldoutFacts | None = None
    """The shipped route's check on the hold-out set (None: the search had none)."""
    target: str | None = None
    """The conditions the spec declares the engine will serve under (``[target]``, in words;
    None in bundles from before the declaration)."""
    target_note: str | None = None
    """Why the figures are not comparable with that target (None: they are, or not recorded):
    the same line ``release`` ends with (:func:`dossier.measure.target.not_comparable`)."""


def target_facts(target: TargetConditions, decision: DecisionRecord | None,
                 trials: list[TrialRecord]) -> tuple[str, str | None]:
    """The declared ``target`` in words and, when the decision's figures do not hold for it,
    the line that says why (:func:`dossier.measure.target.not_comparable`): what ``inspect``,
    ``explain`` and ``release`` print alike."""
    from dossier.measure.target import not_comparable

    d = decision
    if d is None or d.busier_than_declared is None and d.estimator is None:
        return target.text(), None  # decided before targets were declared: nothing recorded
    cond, of = decision_conditions(trials)
    return target.text(), not_comparable(
        target, busier_count=d.busier_than_declared,
        measurements=cond.measurements if cond is not None else 0, of=of,
        estimator=d.estimator, conditional_shipped=d.conditional)


def _target_facts(bundle: Bundle, trials: list[TrialRecord]) -> tuple[str | None, str | None]:
    from dossier.errors import DossierError

    try:
        cache = bundle.tuning_cache()
    except DossierError:
        return None, None
    return target_facts(cache.header.spec.target, cache.decision, trials)


def decision_conditions(trials: list[TrialRecord]) -> tuple[ConditionsSummary | None, str | None]:
    """The conditions the decision was measured under: the last confirmation's measuring
    processes, or without one every search trial; and which of the two."""
    from dossier.measure.conditions import summarize

    confirm = [t for t in trials if t.role == "confirm" and t.conditions]
    if confirm:
        return summarize(confirm[-1].conditions or []), "confirmation"
    got = summarize([c for t in trials for c in t.conditions or []])
    return got, "search" if got is not None else None


RECORDS = (CACHE_NAME,)
"""The files ``inspect`` reads beside the manifest (its per-output losses, latency and
conditions come from the search record)."""


def altered_notes(bundle: Bundle, files: tuple[str, ...] = RECORDS) -> list[str]:
    """Notes for a bundle whose manifest no longer matches its dossier id, or whose ``files``
    (those a view read) no longer match the manifest's file table: the view shows them as
    found, and says so. Empty for an intact bundle (engines are not hashed here: ``dossier
    verify`` checks every file)."""
    from dossier.bundle.manifest import body_digest
    from dossier.errors import DossierError
    from dossier.hashing import digest_file

    out = []
    if body_digest(bundle.raw) != bundle.manifest.dossier_id:
        out.append("manifest.json no longer matches its dossier id (edited after it was "
                   "written?): what follows is shown as found; dossier verify checks the bundle")
    table = bundle.manifest.table()
    for rel in files:
        entry = table.get(rel)
        if entry is None:
            continue
        try:
            digest, size = digest_file(bundle.file(rel))
        except (OSError, DossierError):
            continue  # missing or unreadable: reading it fails on its own, with its message
        if (digest, size) != (entry.digest, entry.size):
            out.append(f"{rel} does not match the manifest's file table (edited after the "
                       "bundle was written?): what follows is shown as found; dossier verify "
                       "checks the bundle")
    return out


def shipped_losses(bundle: Bundle) -> list[OutputWorst] | None:
    """Per output of the shipped route: its worst loss over the pairs and which pair (None
    when the records cannot be read or the route was not validated)."""
    from dossier.errors import DossierError
    from dossier.validation import worst_by_output

    try:
        trials = bundle.tuning_cache().trials
    except DossierError:
        return None
    shipped = next((t for t in trials if t.index == bundle.manifest.summary.shipped_index
                    and t.role != "confirm"), None)
    if shipped is None or not shipped.losses:
        return None
    return [OutputWorst(output=o, loss=v, pair=p)
            for o, (p, v) in worst_by_output(shipped.losses).items()]


def data_sets(bundle: Bundle) -> tuple[list[DataSetFacts], HoldoutFacts | None]:
    """The release's data sets and the shipped route's hold-out check, from the search record
    (empty, None when it cannot be read)."""
    from dossier.errors import DossierError

    try:
        cache = bundle.tuning_cache()
    except DossierError:
        return [], None
    h, table = cache.header, bundle.manifest.table()
    sets = [DataSetFacts(role="validation", size=h.validation_pairs, digest=h.validation_digest,
                         in_bundle="validation" if any(r.startswith("validation/")
                                                       for r in table) else None)]
    for ident in (h.holdout, h.calibration):
        if ident is not None:
            sets.append(DataSetFacts(role=ident.role, size=ident.size, digest=ident.digest,
                                     in_bundle=ident.role if any(
                                         r.startswith(f"{ident.role}/") for r in table)
                                     else None))
    d = cache.decision
    check = None
    if d is not None and d.holdout is not None:
        c = d.holdout
        check = HoldoutFacts(route=c.route, passed=c.passed, worst_loss=c.worst_loss,
                             pairs=c.pairs, reason=c.reason, rejected=list(d.holdout_rejected))
    return sets, check


def precision_warnings(bundle: Bundle) -> list[str]:
    """The warning of a bundle whose shipped route changes the numbers and that no hold-out
    set checked (:func:`dossier.datasets.no_holdout_warning`), worked out from its knob
    database and search record: bundles written before the writer recorded it get it too.
    Empty when it does not apply or the records cannot be read."""
    from dossier.datasets import no_holdout_warning, numeric_changes
    from dossier.errors import DossierError
    from dossier.knobs import KnobDatabase
    from dossier.run_folder import KNOBS_NAME

    try:
        header = bundle.tuning_cache().header
        db = KnobDatabase.model_validate_json(bundle.file(KNOBS_NAME).read_bytes())
    except (DossierError, OSError, ValueError):
        return []
    s = bundle.manifest.summary
    changes = numeric_changes(s.shipped_route, s.baseline_route, db)
    return [no_holdout_warning(changes)] if changes and header.holdout is None else []


def overview_of(bundle: Bundle) -> Overview:
    """The overview of an opened bundle."""
    from dossier.errors import DossierError
    from dossier.measure.latency import of_route

    m, s = bundle.manifest, bundle.manifest.summary
    try:
        trials = list(bundle.tuning_cache().trials)
    except DossierError:
        trials = []
    pairs = s.per_sample
    cond, cond_of = decision_conditions(trials)
    target, target_note = _target_facts(bundle, trials)
    sets, check = data_sets(bundle)
    bt = s.baseline_timing
    base, shipped = m.engines.baseline, m.engines.shipped
    imported = shipped.flags.get("tuning_host_unknown", False)
    return Overview(
        bundle=str(bundle.source), release=m.release, version=m.release_version,
        description=m.description, dossier_id=m.dossier_id, parent=m.parent,
        created_at=m.created_at, format_version=m.format_version, tool_version=m.tool_version,
        backend=m.backend, tuner_version=m.tuner_version,
        model=ModelFacts(file_name=m.model.file_name, size=m.model.size, digest=m.model.digest,
                         algorithm=m.model.algorithm, external_data=len(m.model.external_data),
                         included=m.model_included),
        strategy=s.strategy, selection=s.selection, metric=s.metric, threshold=s.threshold,
        atol=s.atol, rtol=s.rtol, validation_pairs=s.validation_pairs,
        engine_version=shipped.facts.get("tensorrt_version"),
        baseline=BaselineFacts(route=s.baseline_route,
                               trial_index=base.trial_index if base is not None else 0,
                               inferences_per_sample=pairs,
                               sample_median_ms=bt.median_ms if bt else None,
                               sample_ci_low_ms=bt.ci_low_ms if bt else None,
                               sample_ci_high_ms=bt.ci_high_ms if bt else None,
                               samples=bt.n if bt else None),
        winner=WinnerFacts(route=s.shipped_route, trial_index=s.shipped_index,
                           engine=shipped.path,
                           is_baseline=base is not None and shipped.trial_index == base.trial_index),
        baseline_engine=base is not None, gain=s.gain,
        speedup=None if not s.gain or s.speedup is None else SpeedupFacts(
            value=s.speedup, ci_low=s.speedup_ci_low, ci_high=s.speedup_ci_high,
            confidence=s.confidence, p_value=s.p_value),
        result=s.result, reason=s.reason, decision_rule=s.decision_rule,
        runner_up=None if s.runner_up_route is None else RunnerUpFacts(
            route=s.runner_up_route, speedup=s.runner_up_speedup),
        accuracy_by_output=shipped_losses(bundle), aa=s.aa, confirm_aa=s.confirm_aa,
        load=shipped.load, trials=dict(s.trial_counts), confirm_trials=s.confirm_trials,
        search_wall_s=None if imported else s.search_wall_s,
        build_s_total=None if imported else s.build_s_total,
        warnings=[*m.warnings, *(w for w in precision_warnings(bundle) if w not in m.warnings)],
        notes=[*bundle.notes, *altered_notes(bundle), *bundle.load_hints()],
        tuning_host=dict(m.tuning_host),
        shipped_latency=of_route(trials, s.shipped_route, s.baseline_route, pairs),
        baseline_latency=of_route(trials, s.baseline_route, s.baseline_route, pairs),
        conditions=cond, conditions_of=cond_of, target=target, target_note=target_note,
        data_sets=sets, holdout_check=check)
