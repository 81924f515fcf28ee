"""MkDocs hook: the CLI reference page must be what docs/gen_cli.py writes today.

A warning (so ``mkdocs build --strict``, as CI runs it, fails) when docs/cli.md differs from the
commands' current ``--help``.
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path
from typing import Any

log = logging.getLogger("mkdocs.hooks.cli_reference")


def on_pre_build(config: Any) -> None:
    sys.path.insert(0, str(Path(__file__).parent))
    try:
        import gen_cli
    finally:
        sys.path.pop(0)
    if not gen_cli.PAGE.is_file() or gen_cli.PAGE.read_text() != gen_cli.render():
        log.warning("docs/cli.md is not the commands' current --help: run python docs/gen_cli.py")
