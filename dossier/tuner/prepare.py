"""Preparing a search: a spec resolved and checked (backend, knob database, selection, model,
validation set, the other data sets, the baseline) before any file is written."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from dossier.backends import Backend, get_backend
from dossier.datasets import CalibrationSet
from dossier.errors import InputError, SelectionError, SpecError
from dossier.knobs import KnobDatabase
from dossier.measure.target import problems_here
from dossier.routes import Route, Selection
from dossier.spec import ReleaseSpec
from dossier.strategies import Strategy, get_strategy
from dossier.threshold import check_threshold
from dossier.tuner.data_sets import check_calibration, data_sets
from dossier.validation import ValidationSet, load_validation_set


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
    calibration: CalibrationSet | None = None
    holdout: ValidationSet | None = None


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
    unfit = problems_here(spec.target)
    if unfit:
        raise SpecError(f"[target] cannot be honoured on this host: {'; '.join(unfit)}",
                        hint="declare what this host can measure, or release on a host that "
                             "has it")
    backend = get_backend(spec.tune.backend)
    backend.require()
    if spec.scenario.loadgen:  # LoadGen runs the scenario: missing, refused before the search
        from dossier.scenarios.driver import loadgen
        loadgen()
    backend.configure(spec.builder, spec.shapes)
    model = spec.model_path()
    backend.check_model(model)  # a model of another kind is said at once, before the knobs
    strategy = get_strategy(spec.tune.strategy, spec)
    db = backend.knob_database()
    _check_offered(spec.tune.selection, db, backend)
    selection = Selection.parse(spec.tune.selection, db)
    signature = backend.signature(model)
    vset = load_validation_set(spec.resolve(spec.validation.path))
    for pair in vset.pairs:
        signature.check_pair(pair.name, pair.inputs, pair.references)
    for i, entry in enumerate(spec.shapes, start=1):
        signature.check_shape_entry(f"[[shapes]] entry {i}", entry.inputs)
    check_threshold(spec.tune.metric, spec.tune.threshold, vset, atol=spec.tune.atol,
                    rtol=spec.tune.rtol)
    calibration, holdout = data_sets(spec, signature, vset)
    check_calibration(selection, db, backend, calibration)
    baseline = selection.baseline(db)
    spec = _with_timing_defaults(spec, backend.timing_defaults(baseline, db))
    probe = dict(baseline.as_dict())
    for item in selection.items:
        for value in item.values:
            if value == "off":
                probe[item.knob] = "off"
    backend.check_route(model, Route.of(probe), db)
    return Prepared(spec, backend, db, selection, strategy, model, vset, baseline, calibration,
                    holdout)


def _check_offered(text: str, db: KnobDatabase, backend: Backend) -> None:
    """SelectionError with the reason for a knob the backend has but does not offer on this
    host (an execution provider that is not installed, say): not a mere unknown knob."""
    missing = backend.knobs_not_offered()
    for token in text.split():
        name = token.lstrip("-").partition("=")[0]
        if name in missing and name not in db.names():
            raise SelectionError(f"not offered on this host: {missing[name]}",
                                 hint=f"`dossier knobs --backend {db.backend}` lists what is")


def _with_timing_defaults(spec: ReleaseSpec, defaults: dict[str, object]) -> ReleaseSpec:
    """``spec`` with the backend's timing defaults for its engines (:meth:`Backend.
    timing_defaults`) where ``[timing]`` leaves them unset."""
    unset = {k: v for k, v in defaults.items() if k not in spec.timing.model_fields_set}
    if not unset:
        return spec
    return spec.model_copy(update={"timing": spec.timing.model_copy(update=unset)})


def plan(spec: ReleaseSpec) -> tuple[Route, list[Route]]:
    """The baseline and the ordered routes of a strategy that plans ahead (``--dry-run``)."""
    p = prepare(spec)
    if not p.strategy.plans_ahead:
        raise InputError(f"--dry-run cannot list the routes of strategy {p.strategy.name!r}: its "
                        "second phase depends on measured results",
                        hint="dry-run the fast phase with --strategy fast")
    return p.baseline, p.strategy.plan(p.selection, p.db)
