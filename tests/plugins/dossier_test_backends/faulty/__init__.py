"""The fault-injecting test backend (ONNX Runtime plus a ``fault`` knob): :mod:`.backend`."""

from dossier_test_backends.faulty.backend import FAULTS, FaultyBackend

__all__ = ["FAULTS", "FaultyBackend"]
