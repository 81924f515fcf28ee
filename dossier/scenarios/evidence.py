"""The scenario's evidence in a run folder and in a bundle: ``scenario/decision.json`` (the
:class:`~dossier.scenarios.decide.ScenarioDecision`, every LoadGen run's statistics) and
``scenario/logs/config-NN/rep-NN/`` (LoadGen's own summary and detail logs of each
configuration's run at its metric).

Read back from a bundle, they are untrusted: the decision is read with a size limit and
validated by its model; a log is parsed by :mod:`dossier.scenarios.logs` (limits, data only).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from dossier.errors import BundleError
from dossier.files import read_small
from dossier.run_folder import SCENARIO as FOLDER

if TYPE_CHECKING:
    from dossier.bundle.reader import Bundle
    from dossier.scenarios.models import ScenarioDecision

DECISION = f"{FOLDER}/decision.json"
"""The scenario's decision, by its bundle path."""
DECISION_MAX_BYTES = 16 << 20
"""Largest decision read back."""


def read_decision(path: Path) -> ScenarioDecision:
    """A scenario decision file, validated (BundleError, exit 6, for one that is not)."""
    from pydantic import ValidationError

    from dossier.scenarios.models import ScenarioDecision

    try:
        data = read_small(path, DECISION_MAX_BYTES, follow=False)
        return ScenarioDecision.model_validate_json(data)
    except OSError as exc:
        raise BundleError(f"{path}: {exc.strerror or exc}") from None
    except ValidationError as exc:
        err = exc.errors()[0]
        raise BundleError(f"{path}: not a scenario decision: "
                          f"{'.'.join(map(str, err['loc']))[:120]}: {err['msg']}") from None


def recorded(bundle: Bundle) -> ScenarioDecision | None:
    """An opened bundle's scenario decision (None: released for single-stream), validated."""
    if DECISION not in bundle.manifest.table():
        return None
    return read_decision(bundle.file(DECISION))
