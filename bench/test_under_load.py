"""The README's test command under a busy host: ``make test`` from a fresh clone of this commit
while ``--load`` busy processes (4 by default, twice the cores of this 2-core kind) run beside
it, ``--runs`` times (issue: figures that hold where the engine will run; rule fixed before
the runs: every run exits 0)::

    python bench/test_under_load.py --runs 3 --load 4

Each run clones the repository (``git clone`` of HEAD) into a fresh folder and runs ``make
test`` there (its own ``.venv``: the setup step included; pip's cache may serve the wheels).
The busy processes are :class:`dossier.jobs.cotenants.CoTenants` (pinned round robin, nice 0,
bounded in time, gone with this script). Writes ``bench/results/test-under-load.json`` after
every run: per run the exit status, the wall time, pytest's last line and the load average.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from dossier.jobs.cotenants import CoTenants  # noqa: E402
from dossier.measure.target import usable_cores  # noqa: E402

LOAD_MAX_S = 3 * 3600.0


def _git(*args: str) -> str:
    return subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, text=True,
                          check=True).stdout.strip()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--load", type=int, default=4, help="busy background processes")
    ap.add_argument("--work", type=Path, default=None, help="where the clones go (kept)")
    ap.add_argument("--out", type=Path, default=ROOT / "bench/results/test-under-load.json")
    args = ap.parse_args()
    work = args.work or Path(tempfile.mkdtemp(prefix="dossier-test-under-load-"))
    commit = _git("rev-parse", "--short", "HEAD")
    doc: dict[str, object] = {
        "command": " ".join(["python", "bench/test_under_load.py", *sys.argv[1:]]),
        "commit": commit, "cores": os.cpu_count(), "load_processes": args.load,
        "started": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "rule": "every run of make test exits 0", "runs": []}
    runs: list[dict[str, object]] = doc["runs"]  # type: ignore[assignment]
    for i in range(args.runs):
        clone = work / f"run-{i}"
        shutil.rmtree(clone, ignore_errors=True)
        subprocess.run(["git", "clone", "-q", str(ROOT), str(clone)], check=True)
        subprocess.run(["git", "-C", str(clone), "checkout", "-q", commit], check=True)
        busy = CoTenants(args.load, usable_cores(), LOAD_MAX_S)
        busy.start()
        t0 = time.perf_counter()
        try:
            r = subprocess.run(["make", "test"], cwd=clone, capture_output=True, text=True)
        finally:
            busy.stop()
        lines = [x for x in r.stdout.splitlines() if x.strip()]
        (work / f"run-{i}.log").write_text(r.stdout + r.stderr)
        runs.append({"exit": r.returncode, "wall_s": round(time.perf_counter() - t0, 1),
                     "pytest": lines[-1] if lines else "", "load_1m_after": os.getloadavg()[0],
                     "log": str(work / f"run-{i}.log")})
        doc["passed"] = sum(x["exit"] == 0 for x in runs)
        args.out.write_text(json.dumps(doc, indent=1) + "\n")
        print(json.dumps(runs[-1]), flush=True)


if __name__ == "__main__":
    main()
