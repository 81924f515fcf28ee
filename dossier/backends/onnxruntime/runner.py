"""A loaded ONNX Runtime engine: one session over the saved optimized model."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from dossier.backends.interface import Runner


class OnnxRuntimeRunner(Runner):
    """An ORT session over a saved engine."""

    def __init__(self, session: Any) -> None:
        self._session = session
        self._inputs = [i.name for i in session.get_inputs()]
        self._outputs = [o.name for o in session.get_outputs()]

    def io_names(self) -> tuple[list[str], list[str]]:
        return list(self._inputs), list(self._outputs)

    def input_dtypes(self) -> dict[str, str]:
        # ONNX Runtime spells them tensor(float), tensor(double), tensor(int64), ...
        named = {"float": "float32", "double": "float64"}
        out = {}
        for i in self._session.get_inputs():
            t = str(i.type).removeprefix("tensor(").removesuffix(")")
            out[i.name] = named.get(t, t)
        return out

    def fast_run(self) -> Callable[[dict[str, np.ndarray]], dict[str, np.ndarray]]:
        run, outputs = self._session.run, self._outputs
        names = tuple(outputs)
        if len(names) == 1:  # a dict display: a fifth of dict(zip(...))'s time
            (only,) = names

            def one(feed: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
                return {only: run(outputs, feed)[0]}
            return one

        def call(feed: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
            return dict(zip(names, run(outputs, feed)))
        return call

    def run_impl(self, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        # ORT raises its own Fail/InvalidArgument/RuntimeException types: EngineRuntimeError
        values = self._session.run(self._outputs, dict(inputs))
        return dict(zip(self._outputs, values))

