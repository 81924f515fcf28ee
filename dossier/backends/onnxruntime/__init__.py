"""The onnxruntime backend (moved into its package; see backend.py)."""

from dossier.backends.onnxruntime.backend import *  # noqa: F403
