"""Does a periodic wake-up elsewhere on the host change the latency of a multi-threaded ONNX
Runtime session in a process of its own?

On this project's 2-core virtual machine a two-thread session runs at one of two speeds for a
whole process (about 0.40 or 0.63 ms per call of the tblock sample's float32 engine), and
dossier's recorded conditions (load, other processes' CPU time, steal, frequency) do not tell
them apart. One suspect was what else wakes the host: a parent polling its child every 50 ms,
as ``subprocess.Popen.wait`` with a timeout does. This script tests it: each of
``--processes`` rounds starts one fresh timing process per condition, in rotating order:
nothing else running, a sleeper waking every 50 ms, and one waking every 1 ms; each timing
process times ``--calls`` calls after ``--warmup`` untimed ones and reports its median::

    python bench/wakeups.py samples/tblock/model.onnx [--out bench/results/wakeups.json]

A model with float32 inputs; dimensions that are not fixed take ``--batch``.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
CONDITIONS = {"none": None, "sleeper 50 ms": 0.05, "sleeper 1 ms": 0.001}
"""Each condition and the period of its sleeper process (None: no sleeper)."""


def child(model: str, batch: int, warmup: int, calls: int, threads: int) -> float:
    """Median ms per call of one fresh session (ONNX Runtime's defaults but the threads)."""
    import time

    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    sess = ort.InferenceSession(model, so, providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(0)
    feed = {i.name: rng.standard_normal([d if isinstance(d, int) else batch for d in i.shape])
            .astype(np.float32) for i in sess.get_inputs()}
    for _ in range(warmup):
        sess.run(None, feed)
    times = []
    for _ in range(calls):
        t0 = time.perf_counter()
        sess.run(None, feed)
        times.append((time.perf_counter() - t0) * 1e3)
    return float(np.median(times))


def _sleeper(period: float) -> subprocess.Popen[bytes]:
    code = f"import time\nwhile True: time.sleep({period})"
    return subprocess.Popen([sys.executable, "-c", code])  # noqa: S603 - our own interpreter


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("model")
    p.add_argument("--processes", type=int, default=6)
    p.add_argument("--calls", type=int, default=400)
    p.add_argument("--warmup", type=int, default=100)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--threads", type=int, default=0, help="intra-op threads (0: every core)")
    p.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "wakeups.json")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.child:
        print(child(a.model, a.batch, a.warmup, a.calls, a.threads))
        return 0
    names = list(CONDITIONS)
    medians: dict[str, list[float]] = {n: [] for n in names}
    for r in range(a.processes):
        for name in names[r % len(names):] + names[:r % len(names)]:
            period = CONDITIONS[name]
            sleeper = _sleeper(period) if period is not None else None
            try:
                out = subprocess.run(  # noqa: S603 - our own interpreter and script
                    [sys.executable, __file__, a.model, "--child", "--batch", str(a.batch),
                     "--calls", str(a.calls), "--warmup", str(a.warmup),
                     "--threads", str(a.threads)],
                    capture_output=True, text=True, check=True)
            finally:
                if sleeper is not None:
                    sleeper.kill()
                    sleeper.wait()
            medians[name].append(float(out.stdout.strip().splitlines()[-1]))
    base = np.asarray(medians["none"])
    doc: dict[str, Any] = {
        "command": "python bench/wakeups.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        "started": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "commit": subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT,  # noqa: S607
                                 capture_output=True, text=True).stdout.strip(),
        "cores": os.cpu_count(), "model": a.model, "batch": a.batch, "threads": a.threads,
        "calls": a.calls, "warmup": a.warmup, "load_after": list(os.getloadavg()),
        "medians_ms": medians,
        "summary": {n: {"n": len(v), "median_ms": float(np.median(v)), "min_ms": min(v),
                        "max_ms": max(v),
                        "none_over_this_per_round": [float(x) for x in base / np.asarray(v)]}
                    for n, v in medians.items()}}
    a.out.write_text(json.dumps(doc, indent=2) + "\n")
    for n, s in doc["summary"].items():
        print(f"{n:14s} median {s['median_ms']:.4f} ms per call [{s['min_ms']:.4f}, "
              f"{s['max_ms']:.4f}], n={s['n']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
