"""The ONNX Runtime backend (CPU execution provider): :mod:`.backend` (build, load, production
load), :mod:`.knobs`, :mod:`.runner`, :mod:`.policy` (verify rules). Importing it does not import
onnxruntime."""

from dossier.backends.onnxruntime.backend import OnnxRuntimeBackend
from dossier.backends.onnxruntime.knobs import LEVELS, REWRITE_RULES, registered_transformers
from dossier.backends.onnxruntime.runner import OnnxRuntimeRunner

__all__ = ["LEVELS", "REWRITE_RULES", "OnnxRuntimeBackend", "OnnxRuntimeRunner",
           "registered_transformers"]
