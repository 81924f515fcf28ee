"""Two ONNX Runtime sessions taking turns in one process: how much the second one loses to the
first one's spinning threads, and what a pause or turning spinning off does.

Each session has its own intra-op thread pool (2 threads here); after a call its threads spin
for a while waiting for more work (``session.intra_op.allow_spinning``, on by default). On a
host with few cores, a session that starts right after another one shares the cores with those
spinning threads. This script times one model in two sessions alternating in blocks, the
block-median per call of whichever session went first in a round and of the one that went
second, under four conditions: no pause, a 50 ms pause before each block, 3 untimed calls
before each block, and spinning off; or, with ``--pauses``, under pauses of the lengths given::

    python bench/ort_spin.py MODEL.onnx [--out bench/results/ort-spin.json]
    python bench/ort_spin.py MODEL.onnx --pauses 0,1,5,10,20,50 --out bench/results/ort-spin-pauses.json

A model with one input (random float32 of its static shape).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]


def _session(model: Path, spinning: bool) -> Any:
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads = 2
    if not spinning:
        so.add_session_config_entry("session.intra_op.allow_spinning", "0")
    return ort.InferenceSession(str(model), so, providers=["CPUExecutionProvider"])


def turns(model: Path, *, pause_s: float, lead_in: int, spinning: bool, rounds: int = 30,
          calls: int = 8) -> dict[str, float]:
    """Block medians (ms per call) of the session first in a round and of the second."""
    a, b = _session(model, spinning), _session(model, spinning)
    inp = a.get_inputs()[0]
    shape = [d if isinstance(d, int) else 1 for d in inp.shape]
    feed = {inp.name: np.random.default_rng(0).standard_normal(shape).astype(np.float32)}
    for s in (a, b):
        for _ in range(5):
            s.run(None, feed)
    got: dict[str, list[float]] = {"first": [], "second": []}
    for r in range(rounds):
        for pos, s in enumerate((a, b) if r % 2 == 0 else (b, a)):
            time.sleep(pause_s)
            for _ in range(lead_in):
                s.run(None, feed)
            t = []
            for _ in range(calls):
                t0 = time.perf_counter()
                s.run(None, feed)
                t.append(time.perf_counter() - t0)
            got["first" if pos == 0 else "second"].append(float(np.median(t)) * 1e3)
    return {k: round(float(np.median(v)), 3) for k, v in got.items()}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    p.add_argument("model", type=Path)
    p.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "ort-spin.json")
    p.add_argument("--pauses", default="", help="comma-separated pause lengths in ms to time "
                   "instead of the four conditions (each with spinning on, no lead-in), e.g. "
                   "0,1,5,10,20,50: how long the first session's threads take to settle")
    args = p.parse_args(argv)
    conditions = {"no pause": dict(pause_s=0.0, lead_in=0, spinning=True),
                  "3 untimed calls": dict(pause_s=0.0, lead_in=3, spinning=True),
                  "50 ms pause": dict(pause_s=0.05, lead_in=0, spinning=True),
                  "spinning off": dict(pause_s=0.0, lead_in=0, spinning=False)}
    if args.pauses:
        conditions = {f"{ms:g} ms pause": dict(pause_s=ms / 1e3, lead_in=0, spinning=True)
                      for ms in (float(x) for x in args.pauses.split(","))}
    doc = {"command": f"python bench/ort_spin.py {args.model}"
                      + (f" --pauses {args.pauses}" if args.pauses else ""),
           "started": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
           "cores": os.cpu_count(), "load": list(os.getloadavg()),
           "procedure": "one process, two sessions of the model (2 intra-op threads each) "
                        "alternating in 30 rounds of one 8-call block each, the order swapped "
                        "every round; medians over rounds of the block-median ms per call",
           "ms_per_call": {name: turns(args.model, **kw)  # type: ignore[arg-type]
                           for name, kw in conditions.items()}}
    args.out.write_text(json.dumps(doc, indent=1) + "\n")
    print(json.dumps(doc["ms_per_call"], indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
