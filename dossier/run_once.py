"""``dossier run``: a bundle verified and loaded (:func:`dossier.serve.opened`), its engine run
once on given inputs (:mod:`dossier.npz`) or a validation pair's, and optionally its outputs
compared with that pair's references by the bundle's metric and threshold."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from dossier.errors import InputError
from dossier.npz import HINT_INPUTS, read_inputs
from dossier.serve import Engine, opened

if TYPE_CHECKING:
    import numpy as np

    from dossier.bundle import Bundle


@dataclass(frozen=True)
class Check:
    """Outputs of one run compared with a validation pair's references."""

    pair: str
    """The validation pair whose inputs were run."""
    metric: str
    """The bundle's loss metric."""
    threshold: float
    """The bundle's threshold: every loss must be below it."""
    losses: dict[str, float | None]
    """Per output (None: NaN/Inf)."""
    failure: str | None
    """Which output, which loss, when it failed; None when it passed."""

    @property
    def passed(self) -> bool:
        """Every loss below the threshold."""
        return self.failure is None


@dataclass(frozen=True)
class RunResult:
    """What ``dossier run`` did: verify, load, run once, optionally check."""

    engine: Engine
    """The loaded engine."""
    outputs: dict[str, np.ndarray]
    """Its outputs, by name."""
    inputs_from: str
    """The inputs file, or the validation pair whose inputs were run."""
    first_call_ms: float
    """Wall time of the first call (after the load)."""
    load_s: float
    """Wall time of the verification and the load."""
    check: Check | None = None
    """The comparison with the references, when asked for."""

    def summary(self) -> dict[str, Any]:
        """As plain data (``dossier run --json``)."""
        e = self.engine
        return {"bundle_id": e.bundle_id, "backend": e.backend, "route": e.route,
                "verdict": e.report.verdict.value if e.report.verdict else None,
                "steps": [s.model_dump(mode="json") for s in e.report.steps],
                "inputs_from": self.inputs_from,
                "outputs": {n: {"shape": list(a.shape), "dtype": str(a.dtype)}
                            for n, a in self.outputs.items()},
                "load_s": round(self.load_s, 4), "first_call_ms": round(self.first_call_ms, 4),
                "check": None if self.check is None else {
                    "passed": self.check.passed, "pair": self.check.pair,
                    "metric": self.check.metric, "threshold": self.check.threshold,
                    "losses": self.check.losses, "failure": self.check.failure}}


def run_bundle(source: str | os.PathLike[str], inputs: str | os.PathLike[str] | None = None, *,
               check: bool = False, **load_options: Any) -> RunResult:
    """Verify and load (as :func:`load`, ``load_options`` its keywords), run once on the
    arrays of ``inputs`` (an ``.npz``; default: the inputs of the bundle's first validation
    pair), and with ``check`` compare the outputs with the references of the validation pair
    whose inputs they are, by the bundle's metric and threshold. InputError when ``check`` finds
    no pair with these inputs, or the bundle has no validation set."""
    import time

    t0 = time.perf_counter()
    if inputs is not None and not str(inputs):
        raise InputError("no inputs file given (-i is empty)", hint=HINT_INPUTS)
    given = read_inputs(inputs, ("",)) if inputs is not None else None  # checked before the load
    with opened(source, **load_options) as (engine, bundle):
        load_s = time.perf_counter() - t0
        if given is not None and list(given) == [""]:  # one .npy array: the one input's
            if len(engine.inputs) != 1:
                raise InputError(f"{inputs} is a single .npy array; this engine takes "
                                 f"{len(engine.inputs)} inputs {list(engine.inputs)}",
                                 hint=HINT_INPUTS)
            given = {engine.inputs[0]: given[""]}
        pairs = _pairs(bundle) if check or given is None else None
        if given is None:
            assert pairs is not None
            pair, feed, inputs_from = pairs[0], pairs[0].inputs, f"validation {pairs[0].name}"
        else:
            feed, inputs_from = given, str(inputs)
            pair = _matching(pairs, given, engine.report.source) if pairs is not None else None
        t1 = time.perf_counter()
        outputs = engine(feed)
        first_ms = (time.perf_counter() - t1) * 1e3
        judged = _check(bundle, pair, outputs) if check and pair is not None else None
    return RunResult(engine, outputs, inputs_from, first_ms, load_s, judged)


def _pairs(bundle: Bundle) -> list[Any]:
    from dossier.validation import load_validation_set

    folder = bundle.folder("validation")
    if not folder.is_dir():
        raise InputError(f"{bundle.source} has no validation set (imported from trtexec?): "
                         "--check has nothing to compare with, and -i is needed")
    return list(load_validation_set(folder).pairs)


def _matching(pairs: list[Any], given: Mapping[str, np.ndarray], source: str) -> Any:
    import numpy as np

    for pair in pairs:
        if set(pair.inputs) == set(given) and all(
                pair.inputs[n].dtype == given[n].dtype and pair.inputs[n].shape == given[n].shape
                and np.array_equal(pair.inputs[n], given[n]) for n in given):
            return pair
    raise InputError(f"the inputs match none of the {len(pairs)} validation pairs of {source}: "
                     "--check compares the outputs with the references of the pair whose "
                     "inputs were run", hint="pass one pair's inputs, or leave out -i")


def _check(bundle: Bundle, pair: Any, outputs: Mapping[str, np.ndarray]) -> Check:
    from dossier.validation import ValidationSet, judge

    s = bundle.manifest.summary
    acc = judge({pair.name: outputs}, ValidationSet(bundle.folder("validation"), (pair,)),
                s.metric, s.threshold, atol=s.atol, rtol=s.rtol)
    return Check(pair=pair.name, metric=s.metric, threshold=s.threshold,
                 losses=dict(acc.losses[pair.name]), failure=acc.failure)


__all__ = ["Check", "RunResult", "run_bundle"]
