"""The calibration and hold-out sets of a search: read, checked against the model, against each
other and the validation set, and the calibration set asked for where the selection needs one
(:mod:`dossier.datasets` keeps the sets apart; :mod:`dossier.tuner.gate` checks the route
about to ship on the hold-out set)."""

from __future__ import annotations

from dossier.backends import Backend, ModelSignature
from dossier.datasets import CalibrationSet, check_sets, load_calibration_set
from dossier.errors import SpecError
from dossier.knobs import KnobDatabase
from dossier.routes import Route, Selection
from dossier.spec import ReleaseSpec
from dossier.validation import ValidationSet, load_validation_set


def data_sets(spec: ReleaseSpec, signature: ModelSignature, vset: ValidationSet
              ) -> tuple[CalibrationSet | None, ValidationSet | None]:
    """The calibration and hold-out sets a spec names, read and checked against the model and
    against each other and the validation set, every input finite
    (:func:`dossier.datasets.check_sets`)."""
    calibration = holdout = None
    if spec.calibration is not None:
        calibration = load_calibration_set(spec.resolve(spec.calibration.path))
        for name, inputs in calibration.samples:
            signature.check_inputs(f"calibration sample {name}", inputs)
    if spec.holdout is not None:
        holdout = load_validation_set(spec.resolve(spec.holdout.path), "hold-out set")
        for pair in holdout.pairs:
            signature.check_pair(f"hold-out {pair.name}", pair.inputs, pair.references)
    check_sets(vset, calibration, holdout, {t.name: t.dtype for t in signature.inputs})
    return calibration, holdout


def check_calibration(selection: Selection, db: KnobDatabase, backend: Backend,
                      calibration: CalibrationSet | None) -> None:
    """SpecError when a route of the selection needs a calibration set to build and there is
    none."""
    needs = [r for r in _selection_corners(selection, db) if backend.needs_calibration(r, db)]
    if needs and calibration is None:
        raise SpecError(f"the selection has routes that need a calibration set ({needs[0]}), "
                        "and the spec names none",
                        hint="add [calibration] path = ... (inputs only, never validation or "
                             "hold-out samples; `dossier validation split` makes one)")


def _selection_corners(selection: Selection, db: KnobDatabase) -> list[Route]:
    """The baseline with each varied knob at each of its listed values: enough to see whether
    any route of the selection needs data to build (one knob decides it)."""
    base = selection.baseline(db).as_dict()
    return [Route.of({**base, item.knob: v}) for item in selection.items for v in item.values]
