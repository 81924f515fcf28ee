"""The torch_inductor backend (moved into its package; see backend.py)."""

from dossier.backends.torch_inductor.backend import *  # noqa: F403
