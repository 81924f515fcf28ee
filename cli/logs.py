"""Where the library's log records go (``-v``, ``-vv``, ``--log-file``) and the closing status
line of the long commands (docs/logging.md).

The library logs through module loggers under ``dossier`` and configures nothing; the CLI is
the program, so it attaches the handlers: stderr at WARNING (INFO with ``-v``, DEBUG with
``-vv``) and, with ``--log-file``, every record down to DEBUG appended to that file. Only the
``dossier`` and ``dossier_cli`` loggers are touched (a library dossier calls, Ray say, keeps
its own settings), and a second command in the same process (tests) replaces the handlers of
the first.
"""

from __future__ import annotations

import logging
import shlex
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TextIO

from dossier_cli.render import printable

LOGGERS = ("dossier", "dossier_cli")
"""The loggers the CLI configures: the library's and its own."""
STATUS = "dossier_cli.status"
"""The closing line's logger: written to the log file; stderr gets the line itself."""
LEVELS = (logging.WARNING, logging.INFO, logging.DEBUG)
"""stderr's level by the count of ``-v``."""
LONG_COMMANDS = frozenset({"tune", "release", "bundle", "verify", "retune", "push", "pull", "run",
                           "pack", "import"})
"""Commands that end with the closing line (``PASSED | dossier tune ... | 12.3 s``)."""

_installed: list[logging.Handler] = []
_state = {"verbosity": 0, "log_file": False}


class _Printable(logging.Formatter):
    """A record as one printable line: a route or file name from a bundle cannot move the
    cursor or colour what follows (as every line the CLI prints, :func:`printable`)."""

    def format(self, record: logging.LogRecord) -> str:
        return printable(super().format(record))


class _Stderr(logging.StreamHandler):  # type: ignore[type-arg]
    """stderr as it is when a record is written (rich's progress display swaps it for a proxy
    that prints above the bar), not as it was when the handler was made."""

    def __init__(self) -> None:
        super().__init__()
        self.addFilter(lambda record: record.name != STATUS)

    @property
    def stream(self) -> TextIO:
        return sys.stderr

    @stream.setter
    def stream(self, _value: TextIO) -> None:
        pass


def configure(verbosity: int, log_file: Path | None) -> None:
    """Attach the handlers for this command (replacing any a previous command attached).
    Raises OSError when ``log_file`` cannot be opened for appending."""
    reset()
    handlers: list[logging.Handler] = []
    if log_file is not None:
        to_file = logging.FileHandler(log_file, mode="a", encoding="utf-8")
        to_file.setLevel(logging.DEBUG)
        to_file.setFormatter(_Printable("%(asctime)s %(process)d %(levelname)s %(name)s: "
                                        "%(message)s"))
        handlers.append(to_file)
    to_stderr = _Stderr()
    to_stderr.setLevel(LEVELS[min(verbosity, len(LEVELS) - 1)])
    to_stderr.setFormatter(_Printable("%(levelname)s %(name)s: %(message)s"))
    handlers.append(to_stderr)
    lowest = min(h.level for h in handlers)
    for name in LOGGERS:
        logger = logging.getLogger(name)
        logger.setLevel(lowest)
        logger.propagate = False  # the root logger's handlers (if a host program has any) stay out
        for h in handlers:
            logger.addHandler(h)
    _installed.extend(handlers)
    _state.update(verbosity=verbosity, log_file=log_file is not None)


def reset() -> None:
    """Detach and close the handlers :func:`configure` attached."""
    for name in LOGGERS:
        logger = logging.getLogger(name)
        for h in _installed:
            logger.removeHandler(h)
        logger.setLevel(logging.NOTSET)
        logger.propagate = True
    for h in _installed:
        h.close()
    _installed.clear()
    _state.update(verbosity=0, log_file=False)


def closing_line(args: Sequence[str], code: int, seconds: float) -> str:
    """Polygraphy's closing line: ``PASSED | dossier tune spec.toml | 12.3 s``, or ``FAILED``
    with the exit code."""
    status = "PASSED" if code == 0 else f"FAILED (exit {code})"
    return f"{status} | {shlex.join(['dossier', *args])} | {seconds:.1f} s"


def close_command(command: str | None, args: Sequence[str], code: int, seconds: float) -> None:
    """End a long command: its closing line on stderr when a person watches (stderr is a
    terminal) or asked for more (``-v``), and in the log file when there is one. A script
    reading stderr without ``-v`` keeps its one line per error."""
    if command not in LONG_COMMANDS:
        return
    text = closing_line(args, code, seconds)
    logging.getLogger(STATUS).info(text)
    if _state["verbosity"] or _isatty(sys.stderr):
        sys.stderr.write(printable(text) + "\n")
        sys.stderr.flush()


def _isatty(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):  # replaced or closed
        return False
