"""The synthetic landscape test backend (ONNX Runtime engines held to a known landscape's run
times): :mod:`.backend`; the landscape itself: :mod:`.space`."""

from dossier_test_backends.landscape.backend import LandscapeBackend
from dossier_test_backends.landscape.space import Landscape

__all__ = ["Landscape", "LandscapeBackend"]
