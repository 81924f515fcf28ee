"""A loaded ONNX Runtime engine: one session over the saved optimized model."""

from __future__ import annotations

from collections.abc import Mapping
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

    def run_impl(self, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        # ORT raises its own Fail/InvalidArgument/RuntimeException types: EngineRuntimeError
        values = self._session.run(self._outputs, dict(inputs))
        return dict(zip(self._outputs, values))

