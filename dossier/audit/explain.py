"""Why this route: the facts behind a bundle's decision, as one model (:class:`Explanation`).

Everything comes from what the search recorded (the tuning cache, the bundle's tables, the
tuning host's fingerprint and the manifest); nothing is re-measured::

    from dossier.audit import explain
    from dossier.bundle import open_bundle

    with open_bundle(Path("releases/convnet-1.dossier")) as bundle:
        facts = explain(bundle, inferences_per_day=2e6)
    print(facts.decision.reason)
    print(facts.model_dump_json(indent=2))   # what ``dossier explain --json`` prints

The models are :mod:`dossier.audit.explain_model`'s (importable by this module's name too);
the knob effects are worked out in :mod:`dossier.audit.knob_effects`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from dossier.audit.budget import search_budget
from dossier.audit.explain_model import (
    EXPLANATION_FORMAT,
    EXPLANATION_VERSION,
    AACheck,
    DecisionFacts,
    Environment,
    Explanation,
    GpuFacts,
    HeadToHead,
    KnobModel,
    Latency,
    Lineage,
    LossFailure,
    ModelEffect,
    OneKnobEffect,
    OutputLoss,
    RejectedTrial,
    RunnerUp,
    SearchCost,
    SearchSetup,
    TrialFact,
)
from dossier.audit.knob_effects import (
    MODEL_METHOD,
    confirmation_of,
    fit_knob_model,
    one_knob_effects,
)
from dossier.audit.payback import payback
from dossier.audit.trade import Trade, informative, trade
from dossier.backends.tensorrt.trtexec import SOURCE as TRTEXEC
from dossier.cache import CacheHeader, DecisionRecord, HoldoutRecord, SessionRecord
from dossier.fingerprint import Fingerprint
from dossier.knobs import KnobDatabase
from dossier.measure.latency import RouteLatency, of_record, of_route, per_inference
from dossier.measure.reading import PROCESS_TEST, test_name, within_effect
from dossier.measure.timing import TimingSettings
from dossier.routes import Route
from dossier.run_folder import RUNS, WORK, trial_name
from dossier.scenarios.curve import facts
from dossier.trial import Comparison, Outcome, Reading, TrialRecord
from dossier.validation import worst_by_output

if TYPE_CHECKING:
    from dossier.bundle import Bundle, Manifest

__all__ = [
    "EXPLANATION_FORMAT",
    "EXPLANATION_VERSION",
    "AACheck",
    "DecisionFacts",
    "Environment",
    "Explanation",
    "GpuFacts",
    "HeadToHead",
    "KnobModel",
    "Latency",
    "Lineage",
    "LossFailure",
    "ModelEffect",
    "OneKnobEffect",
    "OutputLoss",
    "RejectedTrial",
    "RunnerUp",
    "SearchCost",
    "SearchSetup",
    "TrialFact",
    "explain",
    "explain_search",
    "fit_knob_model",
    "output_losses",
    "run_folder",
    "shown_verdict",
    "test_name",
    "worker_log",
]
"""The models (:mod:`dossier.audit.explain_model`) are imported by this name too."""


def explain(bundle: Bundle, *, inferences_per_day: float | None = None,
            horizon_days: float | None = None, hosts: int | None = None,
            run_dir: Path | None = None) -> Explanation:
    """The explanation of an opened bundle. The expected volume comes from the spec's
    [deployment] section unless given here. ``run_dir``: the run folder that made it, for the
    trials' worker logs (None: the one beside the bundle, :func:`run_folder`, if any)."""
    from dossier.bundle.tables import KNOB_PREFIX

    cache = bundle.tuning_cache()
    decision = cache.decision
    if decision is None:  # the writer refuses unfinished searches; a hand-made bundle may not
        from dossier.errors import BundleFormatError

        raise BundleFormatError(f"{bundle.source}: its tuning cache has no decision record",
                                hint="dossier verify --integrity-only BUNDLE")
    routes = bundle.routes()
    knob_cols = [c for c in routes.column_names if c.startswith(KNOB_PREFIX)]
    rows = routes.select(["index", *knob_cols]).to_pylist()
    knobs = {r["index"]: {c[len(KNOB_PREFIX):]: r[c] for c in knob_cols if r[c] is not None}
             for r in rows}
    from dossier.bundle.overview import precision_warnings

    recorded_warnings = list(bundle.manifest.warnings)
    warnings = [*recorded_warnings,
                *(w for w in precision_warnings(bundle) if w not in recorded_warnings)]
    e = explain_search(cache.header, cache.trials, cache.sessions, decision, knobs=knobs,
                       holdouts=cache.holdouts, warnings=warnings,
                       fingerprint=bundle.fingerprint(), manifest=bundle.manifest,
                       inferences_per_day=inferences_per_day, horizon_days=horizon_days,
                       hosts=hosts, run_dir=run_dir if run_dir is not None
                       else run_folder(bundle))
    from dossier.scenarios.evidence import recorded  # a server or offline release's curve

    scenario = recorded(bundle)
    return e if scenario is None else e.model_copy(update={"scenario": facts(scenario)})


def run_folder(bundle: Bundle) -> Path | None:
    """The run folder that made ``bundle`` when it is still beside it in release's layout
    (``OUT/.runs/NAME-VERSION`` next to ``OUT/NAME-VERSION.dossier``) and its tuning cache
    starts with the bundle's header line (the same search); None otherwise."""
    from dossier.errors import BundleError
    from dossier.run_folder import CACHE_NAME

    folder = Path(bundle.source).parent / RUNS / bundle.manifest.name
    try:
        with open(bundle.file(CACHE_NAME), "rb") as ours:
            first = ours.readline(_HEADER_MAX)
        with open(folder / CACHE_NAME, "rb") as theirs:
            return folder if first and theirs.readline(_HEADER_MAX) == first else None
    except (OSError, BundleError):
        return None


_HEADER_MAX = 1 << 22
"""The most of a tuning cache's first line read to compare it (a header is a few KiB)."""


def worker_log(run_dir: Path | None, t: TrialRecord) -> str | None:
    """Trial ``t``'s worker log in ``run_dir`` when it is there (confirmation trials share
    their measuring processes' logs: none of their own)."""
    if run_dir is None or t.role == "confirm":
        return None
    log = Path(run_dir) / WORK / f"{trial_name(t.index)}.log"
    return str(log) if log.is_file() else None


def explain_search(header: CacheHeader, trials: Sequence[TrialRecord],
                   sessions: Sequence[SessionRecord], decision: DecisionRecord, *,
                   knobs: Mapping[int, Mapping[str, str]] | None = None,
                   fingerprint: Fingerprint | None = None, manifest: Manifest | None = None,
                   inferences_per_day: float | None = None, horizon_days: float | None = None,
                   hosts: int | None = None, run_dir: Path | None = None,
                   holdouts: Sequence[HoldoutRecord] = (),
                   warnings: Sequence[str] | None = None,
                   db: KnobDatabase | None = None) -> Explanation:
    """The explanation of a finished search (a tuning cache's records).

    ``knobs`` gives each trial's effective knob values (routes.parquet's ``knob:`` columns);
    without it they are read from the route texts. ``manifest`` adds the bundle's identity and
    lineage; ``fingerprint`` the tuning host; ``run_dir`` (the run folder) the trials' worker
    logs. ``warnings``: the release's (None: worked out here, with the knob database ``db``
    saying which routes change the numbers).
    """
    settings = header.timing
    trials = list(trials)
    values = _knob_values(trials, knobs)
    main = [t for t in trials if t.role != "confirm"]
    # a trtexec ``full`` search need not have built the default route: no baseline trial
    baseline = next((t for t in trials if t.role == "baseline"), None)
    imported = next((t.extra["source"] for t in trials if t.extra.get("source") == TRTEXEC), None)
    pairs = header.per_sample
    h2h = _head_to_head(trials, decision, settings, pairs)
    contention = _contention_knobs(header.backend)
    from dossier.bundle.overview import decision_conditions, target_facts

    cond, cond_of = decision_conditions(trials)
    target, target_note = target_facts(header.spec.target, decision, list(trials))
    counts: dict[str, int] = {}
    for t in main:
        counts[t.outcome.value] = counts.get(t.outcome.value, 0) + 1
    cost = _cost(trials, sessions)
    dep = header.deployment
    per_day = dep.inferences_per_day if inferences_per_day is None else inferences_per_day
    source: Literal["spec", "flags", "none"] = (
        "flags" if inferences_per_day is not None
        else "spec" if dep.inferences_per_day > 0 else "none")
    pay = payback(
        tuning_s=cost.search_wall_s, gain=decision.gain,
        baseline_median_ms=h2h.baseline.median_ms if h2h and h2h.shipped else None,
        speedup=h2h.speedup if h2h and h2h.shipped else None,
        speedup_ci_low=h2h.speedup_ci_low if h2h and h2h.shipped else None,
        speedup_ci_high=h2h.speedup_ci_high if h2h and h2h.shipped else None,
        inferences_per_day=per_day,
        horizon_days=dep.horizon_days if horizon_days is None else horizon_days,
        hosts=dep.hosts if hosts is None else hosts, source=source,
        inferences_per_sample=pairs)
    if imported:
        pay = pay.model_copy(update={"verdict": f"unknown: the {imported} records neither the "
                                     "search's wall time nor a statistically checked speedup"})
    if imported or baseline is None:
        note = (f"the {imported} has one mean per route (warm-up included), no samples and no "
                "baseline timed alongside, so knob effects cannot be estimated" if imported
                else "no baseline trial to measure effects against")
        knob_model = KnobModel(fitted=False, method=MODEL_METHOD, note=note, trials=0,
                               parameters=0, residual_std=None, r_squared=None, effects=[])
    else:
        knob_model = fit_knob_model(main, values, baseline, settings.confidence)
    return Explanation(
        lineage=_lineage(header, manifest),
        search=SearchSetup(backend=header.backend, strategy=header.strategy,
                           selection=header.selection, metric=header.metric,
                           threshold=header.threshold, validation_pairs=header.validation_pairs,
                           inferences_per_sample=pairs, samples=settings.samples, alpha=settings.alpha,
                           min_effect=settings.min_effect, confidence=settings.confidence,
                           confirm_top=settings.confirm_top),
        decision=DecisionFacts(rule=decision.rule, gain=decision.gain,
                               baseline_route=decision.baseline_route,
                               shipped_route=decision.shipped_route,
                               shipped_index=decision.shipped_index,
                               result="not statistically checked" if imported
                               else _result(decision), reason=decision.reason,
                               why_not=[] if decision.gain or imported
                               else _why_not(h2h, main, trials, settings, decision),
                               statistically_checked=not imported),
        head_to_head=h2h,
        runner_up=_runner_up(trials, decision, h2h),
        trial_counts=dict(sorted(counts.items())),
        confirm_trials=sum(t.role == "confirm" for t in trials),
        rejected=[_rejected(t, header.threshold, worker_log(run_dir, t)) for t in main
                  if t.outcome is not Outcome.OK],
        knob_effects=one_knob_effects(main, values, baseline, settings, trials,
                                       contention) if baseline else [],
        knob_model=knob_model,
        aa_check=_aa(baseline, settings, decision.aa, vetoes=decision.aa_stops)
        if baseline else None,
        confirm_aa_check=next((_aa(t, settings, decision.confirm_aa, vetoes=decision.aa_stops)
                               for t in reversed(trials)
                               if baseline and t.role == "confirm"
                               and t.route == baseline.route), None),
        # an imported record's fingerprint is the "unknown host" placeholder, not a host
        environment=_environment(fingerprint) if fingerprint is not None and not imported
        else None,
        cost=cost,
        payback=pay,
        trials=[_with_confirmed(_trial_fact(t, values.get(t.index, {}), decision.shipped_index,
                                            settings, pairs), t, trials)
                .model_copy(update={"log": worker_log(run_dir, t)}) for t in trials],
        imported_from=imported,
        shipped_latency=of_route(trials, decision.shipped_route, decision.baseline_route, pairs),
        baseline_latency=of_route(trials, decision.baseline_route, decision.baseline_route,
                                  pairs),
        conditions=cond, conditions_of=cond_of, target=target, target_note=target_note,
        contention_knobs=sorted(k for k in {k for v in values.values() for k in v}
                                if k in contention),
        trade=_trade(header, trials, decision, holdouts),
        search_budget=search_budget(header, trials, run_dir),
        warnings=list(warnings) if warnings is not None
        else _precision_warnings(header, decision, db),
    )


def _precision_warnings(header: CacheHeader, decision: DecisionRecord,
                        db: KnobDatabase | None) -> list[str]:
    """The warning of a shipped route that changes the numbers with no hold-out set."""
    from dossier.datasets import no_holdout_warning, numeric_changes

    if db is None or header.holdout is not None:
        return []
    changes = numeric_changes(decision.shipped_route, decision.baseline_route, db)
    return [no_holdout_warning(changes)] if changes else []


def _trade(header: CacheHeader, trials: Sequence[TrialRecord], decision: DecisionRecord,
           holdouts: Sequence[HoldoutRecord]) -> Trade | None:
    t = trade(trials, decision, header.threshold, header.metric, holdouts,
              header.holdout.size if header.holdout else None)
    return t if informative(t) else None


def _knob_values(trials: Sequence[TrialRecord],
                 knobs: Mapping[int, Mapping[str, str]] | None) -> dict[int, dict[str, str]]:
    """Each trial's knob values; a knob a route does not name takes the baseline's value (the
    default, as the baseline pins only what the selection pins)."""
    if knobs is not None:
        out = {i: dict(v) for i, v in knobs.items()}
        by_route = {t.route: out[t.index] for t in trials if t.index in out}
        for t in trials:  # confirmation records are not rows of routes.parquet in every version
            if t.index not in out and t.route in by_route:
                out[t.index] = by_route[t.route]
        if all(t.index in out for t in trials):
            return out
    parsed = {t.index: Route.parse(t.route).as_dict() for t in trials}
    base = next((parsed[t.index] for t in trials if t.role == "baseline"), {})
    names = sorted({k for v in parsed.values() for k in v})
    return {i: {k: v.get(k, base.get(k, "")) for k in names} for i, v in parsed.items()}


def _latency(median: float, lo: float, hi: float, n: int,
             per: RouteLatency | None = None) -> Latency:
    return Latency(median_ms=median, ci_low_ms=lo, ci_high_ms=hi, n=n, per_inference=per)


def _contention_knobs(backend: str) -> frozenset[str]:
    """The backend's contention-sensitive knobs (none when it is not installed here)."""
    from dossier.backends import get_backend
    from dossier.errors import DossierError

    try:
        return get_backend(backend).contention_knobs
    except DossierError:
        return frozenset()


def _with_confirmed(f: TrialFact, t: TrialRecord, trials: Sequence[TrialRecord]) -> TrialFact:
    """A search trial's fact with the confirmation's reading of its route, if any."""
    from dossier.measure.conditions import BUSY_SHARE

    busy = None if not t.conditions else any(c.busy(BUSY_SHARE) for c in t.conditions)
    c = confirmation_of(trials, t.route) if t.role == "search" else None
    if c is None or c.comparison is None:
        return f.model_copy(update={"busy": busy})
    r = c.comparison
    return f.model_copy(update={"busy": busy, "confirmed_speedup": r.speedup,
                                "confirmed_ci_low": r.speedup_ci_low,
                                "confirmed_ci_high": r.speedup_ci_high, "confirmed_in": c.index})


def _head_to_head(trials: Sequence[TrialRecord], decision: DecisionRecord,
                  settings: TimingSettings, pairs: int = 1) -> HeadToHead | None:
    confirms = {t.route: t for t in trials if t.role == "confirm" and t.comparison is not None
                and t.route != decision.baseline_route}
    search = {t.route: t for t in trials if t.role == "search"}
    if decision.gain:
        route = decision.shipped_route
        record = confirms.get(route) or search.get(route)
    elif confirms:
        record = max(confirms.values(), key=lambda t: _cmp(t).speedup)
    else:
        ok = [t for t in search.values() if t.admissible and t.comparison is not None]
        record = max(ok, key=lambda t: _cmp(t).speedup) if ok else None
    if record is None or record.comparison is None or record.timing is None:
        return None
    c, tm = record.comparison, record.timing
    confirmed = record.role == "confirm"
    origin = search.get(record.route)
    spread: tuple[float | None, float | None] = c.round_range() or (None, None)
    return HeadToHead(
        route=record.route, trial_index=origin.index if origin else record.index,
        measured_in=record.index, source="confirmation" if confirmed else "screening",
        shipped=decision.gain and record.route == decision.shipped_route,
        candidate=_latency(tm.median_ms, tm.ci_low_ms, tm.ci_high_ms, tm.n,
                           of_record(record, pairs)),
        baseline=_latency(c.baseline.median_ms, c.baseline.ci_low_ms, c.baseline.ci_high_ms,
                          c.baseline.n, per_inference(
                              record.baseline_samples_ms or [], pairs, route=decision.baseline_route,
                              source="confirmation" if confirmed else "screening",
                              trial_index=record.index)),
        speedup=c.speedup, speedup_ci_low=c.speedup_ci_low, speedup_ci_high=c.speedup_ci_high,
        confidence=settings.confidence, test=c.test, p_value=c.p_value, alpha=c.judged_level,
        rounds=c.rounds,
        round_ratio_low=spread[0], round_ratio_high=spread[1],
        generation_speedups=c.generation_speedups, processes=c.processes,
        process_speedups=c.process_speedups, prediction_low=c.prediction_low,
        prediction_high=c.prediction_high, against=c.against or "baseline",
        significant=c.clears_level, min_effect=settings.min_effect,
        reaches_min_effect=c.reaches(settings.min_effect), interval_includes_one=c.includes_one,
        verdict=c.verdict(settings.min_effect).text)


def shown_verdict(label: str | None, role: str) -> str | None:
    """A verdict as printed beside a reading: a screening (search) trial's is only ever
    *screened* faster or slower (the confirmation decides what ships); others as they are."""
    if label in ("faster", "slower") and role == "search":
        return f"screened {label}"
    return label


def _cmp(t: TrialRecord) -> Comparison:
    assert t.comparison is not None
    return t.comparison


def _result(d: DecisionRecord) -> str:
    from dossier.datasets import decision_result

    return decision_result(d)


def _why_not(h2h: HeadToHead | None, main: Sequence[TrialRecord],
             trials: Sequence[TrialRecord], settings: TimingSettings,
             decision: DecisionRecord) -> list[str]:
    if h2h is None:
        if not any(t.role == "search" for t in main):
            return ["only the baseline was measured"]
        return ["no other route was admissible"]
    record = next(t for t in trials if t.index == h2h.measured_in)
    v = _cmp(record).verdict(settings.min_effect)
    if v.label == "slower":
        return [f"it was slower than the baseline ({v.figures} < alpha={h2h.alpha:.2g})"]
    if v.label == "faster":  # faster, yet not shipped: say which part of the rule stopped it
        return [_stopped_by(record, decision)]
    return list(v.reasons)


def _stopped_by(record: TrialRecord, decision: DecisionRecord) -> str:
    """Why a route that read faster did not ship, from the readings the decision recorded
    (in older records an A/A reading could stop a release, or a gain had to clear its upper
    end; today the confirmation alone decides)."""
    c = _cmp(record)
    if c.test == PROCESS_TEST:
        return "it was not confirmed"
    if record.role == "search" and decision.candidates:
        return "the confirmation, which decides, did not confirm it"
    for aa, where in ((decision.aa, "A/A check"), (decision.confirm_aa, "confirmation's A/A")):
        if aa is not None and aa.significant:
            return f"the {where} read {aa.text()}, which stops the release"
    aa = decision.confirm_aa if record.role == "confirm" else decision.aa
    if aa is not None and c.speedup_ci_low <= aa.speedup_ci_high:
        return (f"its interval's lower end {c.speedup_ci_low:.3f} does not clear the "
                f"{'confirmation ' if record.role == 'confirm' else ''}A/A reading's upper end "
                f"{aa.speedup_ci_high:.3f}")
    return "it was not confirmed"


def _runner_up(trials: Sequence[TrialRecord], decision: DecisionRecord,
               h2h: HeadToHead | None) -> RunnerUp | None:
    shipped = decision.shipped_route
    search = {t.route: t for t in trials if t.role == "search"}
    confirms = {t.route: t for t in trials if t.role == "confirm" and t.comparison is not None
                and t.route != decision.baseline_route}
    ok = [t for t in search.values() if t.admissible and t.comparison is not None
          and t.route != shipped]
    if not ok:
        return None
    route = decision.runner_up_route if decision.runner_up_route in {t.route for t in ok} \
        else max(ok, key=lambda t: _cmp(t).speedup).route
    other = search[route]
    if route in confirms and (shipped in confirms or not decision.gain):
        source: Literal["confirmation", "screening"] = "confirmation"
        r = _cmp(confirms[route])
        w = _cmp(confirms[shipped]).speedup if decision.gain else 1.0
    else:
        source = "screening"
        r = _cmp(other)
        w = _cmp(search[shipped]).speedup if decision.gain and shipped in search \
            and search[shipped].comparison is not None else 1.0
    return RunnerUp(route=route, trial_index=other.index, speedup=r.speedup,
                    speedup_ci_low=r.speedup_ci_low, speedup_ci_high=r.speedup_ci_high,
                    source=source, winner_speedup=w, margin=w / r.speedup - 1)


def _rejected(t: TrialRecord, threshold: float, log: str | None = None) -> RejectedTrial:
    failures = []
    if t.outcome is Outcome.REJECTED:
        for pair, per in sorted((t.losses or {}).items()):
            for output, loss in sorted(per.items()):
                if loss is None or not math.isfinite(loss) or loss >= threshold:
                    failures.append(LossFailure(pair=pair, output=output,
                                                loss=loss if loss is None or math.isfinite(loss)
                                                else None, threshold=threshold))
    return RejectedTrial(
        index=t.index, route=t.route, outcome=t.outcome,
        reason=t.reason or t.outcome.value, failures=failures,
        error=None if t.outcome is Outcome.REJECTED else (t.reason or t.outcome.value),
        speedup=t.comparison.speedup if t.comparison else None, log=log)


def _aa(baseline: TrialRecord, settings: TimingSettings, recorded: Reading | None = None, *,
        vetoes: bool = True) -> AACheck | None:
    """The A/A check of ``baseline`` (trial 0, or the confirmation's A/A record). Whether it
    was significant is what the decision recorded for this record (``recorded``, the decision
    record's ``aa`` or ``confirm_aa``: the reading the release was decided on, under the rule in
    force then); only a decision that recorded no reading of it is judged by today's rule.
    ``vetoes``: the decision was taken by an older rule, under which a significant A/A stopped
    the release (today's confirmation tests each candidate against the A/A instead)."""
    c = baseline.comparison
    reading = baseline.reading(settings.min_effect)
    if c is None or reading is None:
        return None
    if recorded is not None and recorded.trial_index == baseline.index \
            and recorded.rounds == c.rounds:
        reading = recorded
    if not vetoes:
        inside = reading.includes_one
        where = ("in the same measuring processes: the confirmation tests each candidate "
                 "against this second load, so a difference between loads cancels"
                 if c.test == PROCESS_TEST else
                 "in screening, which only ranks: the confirmation decides")
        verdict = (f"two loads of the same engine read apart ({reading.text()}), {where}"
                   if reading.significant else
                   f"as expected: no significant difference between two loads of the same "
                   f"engine ({where})")
        return AACheck(trial_index=baseline.index, procedure=reading.procedure,
                       rounds=reading.rounds, processes=reading.processes,
                       significant=reading.significant,
                       speedup=reading.speedup, speedup_ci_low=reading.speedup_ci_low,
                       speedup_ci_high=reading.speedup_ci_high, p_value=reading.p_value,
                       includes_one=inside, verdict=verdict)
    m = settings.min_effect
    inside = reading.includes_one
    significant = reading.significant
    below = within_effect(reading.speedup, m)
    low_p = reading.p_value < settings.alpha
    if significant and below:  # decided by a rule that stopped at any significant A/A
        verdict = ("significant: two loads of the same engine timed differently (p < alpha), "
                   "and the rule this search was decided by stopped the release at that, so "
                   f"nothing ships (today's rule stops it only at the minimum effect of {m:.0%} "
                   "or more)")
    elif significant:
        verdict = ("significant: two loads of the same engine timed differently, by at least "
                   "the minimum effect, so the procedure is biased on this host by about that "
                   "much and nothing ships")
    else:
        verdict = "as expected: no significant difference between two loads of the same engine"
        if low_p and below:
            verdict += f" (p < alpha, but below the minimum effect of {m:.0%}"
        elif low_p:
            verdict += " (p < alpha, but not significant as decided"
        elif not inside:
            verdict += " (the interval excludes 1.0 narrowly"
        if low_p or not inside:
            verdict += ": a gain must clear its upper end)"
    return AACheck(trial_index=baseline.index, procedure=reading.procedure,
                   rounds=reading.rounds, significant=significant, speedup=reading.speedup,
                   speedup_ci_low=reading.speedup_ci_low,
                   speedup_ci_high=reading.speedup_ci_high, p_value=reading.p_value,
                   includes_one=inside, verdict=verdict)


def _cost(trials: Sequence[TrialRecord], sessions: Sequence[SessionRecord]) -> SearchCost:
    main = [t for t in trials if t.role != "confirm"]
    confirm_rounds = {t.started_at: t.trial_s for t in trials if t.role == "confirm"}
    confirm_s = sum(confirm_rounds.values())
    return SearchCost(
        search_wall_s=sum(s.wall_s for s in sessions),
        build_s=sum(t.build_s or 0.0 for t in trials if t.role != "confirm"),
        cached_builds=sum(1 for t in main
                          if t.build_s is not None and t.extra.get("build_cache") == "hit"),
        measure_s=sum(t.phases_s.get("time", 0.0) for t in main) + confirm_s,
        confirm_s=confirm_s, trials=len(main), confirm_trials=len(trials) - len(main),
        sessions=len(sessions), recovered_sessions=sum(1 for s in sessions if s.recovered),
        raced=sum(1 for t in main if t.raced))


def _lineage(h: CacheHeader, m: Manifest | None) -> Lineage:
    if m is None:
        return Lineage(release=h.release, version=h.release_version, description=h.description,
                       dossier_id=None, parent=None, first_release=True, created_at=h.created_at,
                       tool_version=h.tool_version, backend=h.backend,
                       tuner_version=h.tuner_version)
    return Lineage(release=m.release, version=m.release_version, description=m.description,
                   dossier_id=m.dossier_id, parent=m.parent, first_release=m.parent is None,
                   created_at=m.created_at, tool_version=m.tool_version, backend=m.backend,
                   tuner_version=m.tuner_version)


def _environment(fp: Fingerprint) -> Environment:
    return Environment(
        hostname=fp.hostname, cpu=fp.cpu.model, cpu_vendor=fp.cpu.vendor, cores=fp.cpu.cores,
        physical_cores=fp.cpu.physical_cores, isa_flags=list(fp.cpu.isa_flags),
        os=fp.os.distribution or fp.os.system, kernel=fp.os.release, machine=fp.os.machine,
        glibc=fp.os.glibc, python=f"{fp.python.implementation} {fp.python.version}",
        packages=dict(sorted(fp.packages.items())),
        gpus=[GpuFacts(name=g.name, compute_capability=g.compute_capability,
                       memory_total_mib=g.memory_total_mib, driver_version=g.driver_version)
              for g in fp.gpus],
        cuda_runtime=fp.cuda_runtime, collected_at=fp.collected_at)


def output_losses(losses: Mapping[str, Mapping[str, float | None]] | None) -> list[OutputLoss]:
    """Per output, the worst loss over the pairs and its pair."""
    return [OutputLoss(output=o, loss=v if v is None or math.isfinite(v) else None, pair=p)
            for o, (p, v) in worst_by_output(losses).items()]


def _trial_fact(t: TrialRecord, knobs: Mapping[str, str], shipped_index: int,
                settings: TimingSettings, pairs: int = 1) -> TrialFact:
    tm, c = t.timing, t.comparison
    return TrialFact(
        index=t.index, role=t.role, route=t.route, knobs=dict(knobs), outcome=t.outcome,
        reason=t.reason, worst_loss=t.worst_loss, output_losses=output_losses(t.losses),
        baseline_median_ms=c.baseline.median_ms if c else None,
        verdict=None if c is None else c.verdict(settings.min_effect).label, raced=t.raced,
        median_ms=tm.median_ms if tm else None, ci_low_ms=tm.ci_low_ms if tm else None,
        ci_high_ms=tm.ci_high_ms if tm else None, n=tm.n if tm else None,
        speedup=c.speedup if c else None, speedup_ci_low=c.speedup_ci_low if c else None,
        speedup_ci_high=c.speedup_ci_high if c else None, p_value=c.p_value if c else None,
        build_s=t.build_s, trial_s=t.trial_s,
        shipped=t.index == shipped_index and t.role != "confirm", latency=of_record(t, pairs))
