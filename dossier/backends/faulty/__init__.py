"""The faulty backend (moved into its package; see backend.py)."""

from dossier.backends.faulty.backend import *  # noqa: F403
