"""dossier's test-only backends, ``faulty`` (real faults: SIGKILL, SIGSEGV, NaN outputs, ...)
and ``landscape`` (a synthetic landscape of known run times), registered for the test suite
alone.

They are not part of the ``dossier`` package and its distribution declares no entry point for
them. The folder that holds this package, ``tests/plugins/``, also holds
``dossier_test_backends-0.dist-info/entry_points.txt``, which registers them in the
``dossier.backends`` entry-point group; Python finds that record only when the folder is on the
module search path. ``tests/conftest.py`` puts it there, first on ``sys.path`` and first on
``PYTHONPATH`` (so that every process the tests start, the CLI and trial processes alike,
finds them); ``bench/calibration.py`` and ``bench/replay.py`` do the same. Nothing else does:
an installed dossier, a user's environment and a bundle cannot reach them (a bundle names a
backend, it cannot add a folder to the search path). Even where they are registered, a
bundle naming a backend marked ``for_tests`` is INVALID (``dossier verify``) and is never
loaded (``dossier.load``, ``dossier run``): :func:`dossier.backends.not_served`.
"""

import os
import sys
from pathlib import Path

PLUGINS = Path(__file__).resolve().parents[1]
"""``tests/plugins``: the folder to put on the search path."""


def enable() -> None:
    """Register the test backends in this process and in every process it starts: ``PLUGINS``
    first on ``sys.path`` and on ``PYTHONPATH`` (call before a backend is looked up)."""
    if str(PLUGINS) not in sys.path:
        sys.path.insert(0, str(PLUGINS))
    kept = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep)
            if p and p != str(PLUGINS)]
    os.environ["PYTHONPATH"] = os.pathsep.join([str(PLUGINS), *kept])
