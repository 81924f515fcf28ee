"""Where a benchmark's figures came from: the command that produced them, when, and on what.

Every script of bench/ writes ``"provenance": provenance()`` into its results file, so a figure
quoted from bench/results/ names the command that re-derives it, the date and the machine.
"""

from __future__ import annotations

import datetime
import os
import platform
import shlex
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


def cpu_model() -> str | None:
    """The CPU's model name, from /proc/cpuinfo (None where there is none)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or None


def host() -> dict[str, Any]:
    """The machine: architecture, CPU model, CPUs usable here, memory, OS and Python."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:
        cpus = os.cpu_count() or 0
    try:
        memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        memory = None
    try:
        load = [round(x, 2) for x in os.getloadavg()]
    except OSError:
        load = None
    return {"machine": platform.machine(), "cpu": cpu_model(), "cpus": cpus,
            "memory_bytes": memory, "system": platform.platform(),
            "python": platform.python_version(), "load_average_at_start": load}


def provenance(argv: list[str] | None = None) -> dict[str, Any]:
    """The command (as typed from the repository root), the UTC date and the host."""
    args = sys.argv if argv is None else argv
    script = Path(args[0]).resolve()
    shown = str(script.relative_to(ROOT)) if script.is_relative_to(ROOT) else str(script)
    return {"command": shlex.join(["python", shown, *args[1:]]),
            "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "host": host()}
