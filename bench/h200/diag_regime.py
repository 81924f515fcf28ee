"""What moves a launch-bound engine's latency between two levels (about 2.0 and 3.1 ms for the
ResNet-50 b1 default route on the H200): time one engine in short blocks, alone in a fresh
process loaded as in production, and record beside every block's median the GPU's SM clock
(NVML), the CPU the timing thread ran on and the load average.

Phases (each in its own fresh process per engine): ``busy`` blocks back to back; ``gaps`` a
0.5 s pause after every block (as a measuring process waits while the others time theirs);
``pinned`` back to back with the process bound to one CPU.

    python bench/h200/diag_regime.py --run RUN_DIR --json FILE [--seconds 12]
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

BLOCK_S = 0.25


def _child(engine: str, route: str, validation: str, backend_name: str, builder: dict,
           phase: str, seconds: float) -> dict[str, Any]:
    import numpy as np

    from dossier.backends import get_backend
    from dossier.jobs.worker import _timers
    from dossier.routes import Route
    from dossier.validation import load_validation_set

    try:
        import pynvml

        pynvml.nvmlInit()
        handle = pynvml.nvmlDeviceGetHandleByIndex(0)

        def sm_clock() -> int | None:
            return int(pynvml.nvmlDeviceGetClockInfo(handle, pynvml.NVML_CLOCK_SM))
    except Exception:  # noqa: BLE001 - no NVML: no clock column
        def sm_clock() -> int | None:
            return None
    libc = ctypes.CDLL(None)
    if phase == "pinned":
        cpus = sorted(os.sched_getaffinity(0))
        os.sched_setaffinity(0, {cpus[min(2, len(cpus) - 1)]})
    backend = get_backend(backend_name)
    backend.configure(builder, [])
    vset = load_validation_set(Path(validation))
    runner = backend.load(Path(engine), Route.parse(route))
    fn = _timers(runner, vset.timing_groups("pairs"))
    for _ in range(200):
        fn(0)
    blocks = []
    t_end = time.perf_counter() + seconds
    while time.perf_counter() < t_end:
        start = time.perf_counter()
        xs = []
        while time.perf_counter() - start < BLOCK_S:
            xs.append(fn(0))
        blocks.append({"median_ms": round(float(np.median(xs)), 4), "n": len(xs),
                       "sm_mhz": sm_clock(), "cpu": int(libc.sched_getcpu()),
                       "load1": os.getloadavg()[0]})
        if phase == "gaps":
            time.sleep(0.5)
            blocks[-1]["sm_mhz_after_gap"] = sm_clock()
    meds = [b["median_ms"] for b in blocks]
    return {"phase": phase, "route": route, "blocks": blocks,
            "median_ms": float(np.median(meds)), "min_block_ms": min(meds),
            "max_block_ms": max(meds)}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--run", type=Path)
    ap.add_argument("--json", type=Path)
    ap.add_argument("--seconds", type=float, default=12.0)
    ap.add_argument("--child", nargs=7)
    args = ap.parse_args()
    if args.child:
        engine, route, validation, backend, builder, phase, seconds = args.child
        print(json.dumps(_child(engine, route, validation, backend, json.loads(builder), phase,
                                float(seconds))))
        return 0

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from steps import CACHE_FILE, _best_target  # type: ignore[import-not-found]

    from dossier.backends import get_backend
    from dossier.cache import TuningCache

    cache = TuningCache.open(args.run / CACHE_FILE, repair=True)
    h = cache.header
    base = next(t for t in cache.trials if t.role == "baseline")
    target, _ = _best_target(cache)
    engines = [(base.engine, h.baseline_route)]
    if target is not None and target.engine:
        engines.append((target.engine, target.route))
    backend = get_backend(h.backend)
    out: dict[str, Any] = {"run": str(args.run), "block_s": BLOCK_S, "phases": []}
    for phase in ("busy", "gaps", "pinned"):
        for engine, route in engines:
            path = args.run / engine
            env = {**os.environ, **backend.loader_env(path)}
            p = subprocess.run(  # noqa: S603 - our own script
                [sys.executable, __file__, "--child", str(path), route, h.validation_path,
                 h.backend, json.dumps(h.builder), phase, str(args.seconds)],
                capture_output=True, text=True, env=env, check=False)
            try:
                out["phases"].append(json.loads(p.stdout.strip().splitlines()[-1]))
            except (IndexError, json.JSONDecodeError):
                out["phases"].append({"phase": phase, "route": route,
                                      "error": p.stderr[-1500:]})
            args.json.write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
