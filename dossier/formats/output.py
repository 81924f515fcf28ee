"""Writing a rendered report to a file (``--output FILE``, ``explain --html FILE``)."""

from __future__ import annotations

import os
from pathlib import Path

from dossier.diskfull import host_io
from dossier.errors import OutputError
from dossier.files import begin_staging, write_durable


def write_output(path: Path, text: str, *, example: str = "report.txt") -> None:
    """Write ``text`` (UTF-8) to ``path``, replaced if it exists, through a staging file
    renamed into place: an interrupted or failed write leaves the old file or none, never half
    a report. OutputError (exit 7) when ``path`` is a folder (the hint names ``example`` in it)
    or cannot be written; DiskFullError (exit 74) on a full disk."""
    path = Path(path)
    if path.is_dir():
        raise OutputError(f"{path} is a folder", hint=f"give a file name, e.g. {path / example}")
    staging = None
    try:
        with host_io(path.parent, f"writing {path}"):
            staging = begin_staging(path.parent, path.name, directory=False)
            write_durable(staging, text.encode("utf-8"))
            os.replace(staging, path)
            staging = None
    except OSError as exc:
        raise OutputError(f"cannot write {path}: {exc.strerror or exc}",
                          hint="check that its folder is writable") from exc
    finally:
        if staging is not None:
            staging.unlink(missing_ok=True)
