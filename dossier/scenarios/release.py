"""A release under a server or offline scenario: after the single-stream decision, the serving
configurations of the engine it chose compete under the scenario, and the scenario's choice
ships.

The single-stream decision (screening, confirmation, A/A, Holm, the hold-out check) picks the
engine: which build route's numbers and speed may ship. Its serving configurations are the
admissible trials with the *same engine file* (same digest) whose routes differ from the shipped
one in load-time knobs only (``serving_sessions``, ``intra_op_num_threads``...): they compute
the same numbers, so the accuracy filter and the hold-out check stand. They exist when the
selection varies load-time knobs. Under the scenario they are measured by LoadGen
(:func:`dossier.scenarios.decide.decide`: repetitions as the unit, the A/A copy, the minimum
effect, Holm); when one is confirmed to serve more than the single-stream choice, a new
decision record names it (the cache keeps the single-stream one before it), with the scenario's
reading in its reason. Without serving configurations, the single-stream choice is measured
under the scenario alone, for the record.

Everything goes to ``scenario/`` in the run folder: ``decision.json`` (:class:`ScenarioDecision`,
every LoadGen run's parsed statistics) and LoadGen's own logs of each configuration's run at
its metric, which the bundle carries like every other file (hashed, signed).
"""

from __future__ import annotations

import logging
import shutil
from collections.abc import Callable
from pathlib import Path

from dossier.cache import DecisionRecord, TuningCache
from dossier.knobs import KnobDatabase, KnobPhase
from dossier.measure.timing import TimingSettings
from dossier.routes import Route
from dossier.run_folder import SCENARIO as FOLDER
from dossier.scenario import ScenarioSection
from dossier.scenarios.child import ScenarioRequest
from dossier.scenarios.decide import decide
from dossier.scenarios.evidence import read_decision
from dossier.scenarios.logs import KEPT
from dossier.scenarios.models import RunSettings, ScenarioDecision
from dossier.scenarios.pool import sessions_of
from dossier.trial import TrialRecord

logger = logging.getLogger(__name__)

CANDIDATES_MAX = 2
"""Serving configurations measured beside the single-stream choice, at most."""


def serving_variants(cache: TuningCache, shipped: TrialRecord, db: KnobDatabase
                     ) -> list[TrialRecord]:
    """Admissible trials with ``shipped``'s engine whose routes differ from its route in
    load-time knobs only, in the order of their single-stream medians (at most
    :data:`CANDIDATES_MAX`)."""
    mine = Route.parse(shipped.route).effective(db)
    out = []
    for t in cache.trials:
        if t.index == shipped.index or not t.admissible or t.engine_digest != \
                shipped.engine_digest or t.route == shipped.route:
            continue
        theirs = Route.parse(t.route).effective(db)
        differ = {k for k in mine.keys() | theirs.keys() if mine.get(k) != theirs.get(k)}
        if differ and all(db.get(k).phase is KnobPhase.LOAD for k in differ if k in db.names()):
            out.append(t)
    out.sort(key=lambda t: t.timing.median_ms if t.timing else float("inf"))
    first = {t.route: t for t in reversed(out)}  # one trial per route: the fastest
    return sorted(first.values(), key=out.index)[:CANDIDATES_MAX]


def _name(t: TrialRecord) -> str:
    return f"trial {t.index}: {t.route or 'default route'}"


def after_search(cache: TuningCache, decision: DecisionRecord, run_dir: Path, db: KnobDatabase,
                 scenario: ScenarioSection, *, backend: str, timing: TimingSettings,
                 progress: Callable[[str], None] | None = None) -> DecisionRecord:
    """Decide under ``scenario`` among the shipped engine's serving configurations; the
    decision record that stands (a new one appended to ``cache`` when the scenario's choice is
    another configuration). Nothing is done for single-stream."""
    if not scenario.loadgen:
        return decision
    folder = run_dir / FOLDER
    if (folder / "decision.json").is_file():  # finished before a kill: not measured again
        out = read_decision(folder / "decision.json")
        return _record(cache, decision, out, scenario, timing)
    trials = {t.index: t for t in cache.trials}
    shipped = trials[decision.shipped_index]
    variants = serving_variants(cache, shipped, db)
    validation = cache.header.validation_path

    def request(t: TrialRecord) -> ScenarioRequest:
        return ScenarioRequest(source="engine", path=str(run_dir / (t.engine or "")),
                               backend=backend, route=t.route, validation=validation,
                               sessions=sessions_of(t.route),
                               settings=RunSettings(kind="server", qps=1, duration_s=1,
                                                    max_duration_s=1))

    out = decide(scenario, (_name(shipped), request(shipped)),
                 [(_name(t), request(t)) for t in variants], folder / "runs",
                 min_effect=timing.min_effect, alpha=timing.alpha,
                 confidence=timing.confidence,
                 aa=len(variants) > 0 and scenario.processes >= 2,
                 progress=progress or (lambda line: logger.info("scenario: %s", line)))
    _keep(out, folder)  # before the record: a kill between them leaves it to be appended
    return _record(cache, decision, out, scenario, timing)


def _record(cache: TuningCache, decision: DecisionRecord, out: ScenarioDecision,
            scenario: ScenarioSection, timing: TimingSettings) -> DecisionRecord:
    """The decision that stands after ``out``: ``decision`` when the single-stream choice ships
    or the cache names the scenario's choice already, else a new record appended."""
    if out.shipped == out.baseline:
        return decision
    route = out.reading(out.shipped).route
    if decision.shipped_route == route:  # appended before (a resumed search)
        return decision
    base = next(t for t in cache.trials if t.index == decision.shipped_index)
    chosen = next(t for t in cache.trials if t.route == route and t.admissible
                  and t.engine_digest == base.engine_digest)
    verdict = next(v for v in out.verdicts if v.name == out.shipped)
    reason = (f"{decision.reason}; under the {scenario.describe()} scenario, {chosen.route} "
              f"served {verdict.ratio:.3g}x [{verdict.low:.3g}, {verdict.high:.3g}] the QPS of "
              f"{base.route or 'the default route'} (same engine; LoadGen, "
              f"{out.repetitions} repetitions): it ships")
    record = decision.model_copy(update={
        "shipped_route": chosen.route, "shipped_index": chosen.index, "reason": reason,
        "scenario": True,
        "rule": f"{decision.rule}; then the scenario's serving configurations "
                f"({scenario.describe()}, minimum effect {timing.min_effect:g}, Holm at "
                f"{timing.alpha:g})"})
    cache.append(record)
    return record


def _keep(out: ScenarioDecision, folder: Path) -> None:
    """``decision.json`` and, per configuration and repetition, LoadGen's logs of the run at
    the metric; the other runs' folders are removed (their statistics are in the decision)."""
    logs = folder / "logs"
    shutil.rmtree(logs, ignore_errors=True)
    for c, reading in enumerate(out.readings):
        for rep, res in enumerate(reading.results):
            best = res.at_metric()
            if best is None:
                continue
            index = res.probes.index(best)
            src = folder / "runs" / f"rep-{rep:02d}" / f"{c:02d}" / f"run-{index:03d}" / "loadgen"
            dst = logs / f"config-{c:02d}" / f"rep-{rep:02d}"
            dst.mkdir(parents=True, exist_ok=True)
            for name in KEPT:
                if (src / name).is_file():
                    shutil.copyfile(src / name, dst / name)
    shutil.rmtree(folder / "runs", ignore_errors=True)
    (folder / "decision.json").write_text(out.model_dump_json(indent=2) + "\n")
