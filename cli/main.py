"""The ``dossier`` command: parse, call :mod:`dossier`, render, map errors to exit codes.

Each ``cmd_*`` module registers its commands on :data:`cli.app.app`.
"""

from __future__ import annotations

import sys

import cli.cmd_bundle  # noqa: F401 - release, bundle, inspect, pack, schema
import cli.cmd_explain  # noqa: F401 - explain, diff
import cli.cmd_registry  # noqa: F401 - push, pull
import cli.cmd_sign  # noqa: F401
import cli.cmd_trtexec  # noqa: F401 - import, export
import cli.cmd_tune  # noqa: F401 - knobs, tune
import cli.cmd_validation  # noqa: F401 - validation create, show
import cli.cmd_verify  # noqa: F401 - verify, retune
from cli.app import app


def main() -> None:
    """Console-script entry point."""
    app(prog_name="dossier")


if __name__ == "__main__":
    sys.exit(main())
