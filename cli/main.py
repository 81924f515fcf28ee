"""The ``dossier`` command: parse, call :mod:`dossier`, render, map errors to exit codes.

Each ``cmd_*`` module registers its commands on :data:`dossier_cli.app.app`.
"""

from __future__ import annotations

import os
import signal

# dossier uses no pydantic plugin; looking for them (an entry-point scan) costs every command
# ~20 ms of its start. A user who wants theirs sets the variable (to "") themselves.
os.environ.setdefault("PYDANTIC_DISABLE_PLUGINS", "__all__")

import dossier_cli.cmd_bundle  # noqa: F401 - release, bundle, inspect, pack, schema
import dossier_cli.cmd_explain  # noqa: F401 - explain, diff
import dossier_cli.cmd_registry  # noqa: F401 - push, pull
import dossier_cli.cmd_run  # noqa: F401
import dossier_cli.cmd_sign  # noqa: F401
import dossier_cli.cmd_trtexec  # noqa: F401 - import, export
import dossier_cli.cmd_tune  # noqa: F401 - knobs, tune
import dossier_cli.cmd_validation  # noqa: F401 - validation create, show
import dossier_cli.cmd_verify  # noqa: F401 - verify, retune
from dossier_cli.app import app


def _terminated(signum: int, _frame: object) -> None:
    raise SystemExit(128 + signum)


def main() -> None:
    """Console-script entry point. SIGTERM and SIGHUP unwind like an exception, so locks are
    released and temporary folders removed on those exits too (kill -9 cannot be caught: the
    kernel drops its locks, and the next command removes its temporary folders)."""
    for sig in (signal.SIGTERM, signal.SIGHUP):
        if signal.getsignal(sig) is signal.SIG_DFL:  # nohup's ignored SIGHUP stays ignored
            signal.signal(sig, _terminated)
    app(prog_name="dossier")


if __name__ == "__main__":
    main()
