"""The figures the reliability, fuzz and signing tests measured (for docs/reliability.md). Not collected.

Each test that measures something calls :func:`figures`; ``pytest -s`` shows the lines, and with
``DOSSIER_FIGURES=FILE`` they are appended to FILE as JSON Lines.
"""

from __future__ import annotations

import json
import os


def figures(name: str, **values: object) -> None:
    """Print what a test measured; append it to $DOSSIER_FIGURES when that is set."""
    line = json.dumps({"test": name, **values}, sort_keys=True)
    print(line)
    if os.environ.get("DOSSIER_FIGURES"):
        with open(os.environ["DOSSIER_FIGURES"], "a", encoding="utf-8") as f:
            f.write(line + "\n")
