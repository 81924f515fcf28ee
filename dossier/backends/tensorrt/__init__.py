"""The tensorrt backend (moved into its package; see backend.py)."""

from dossier.backends.tensorrt.backend import *  # noqa: F403
