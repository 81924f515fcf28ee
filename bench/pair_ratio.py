"""The speedup of one ONNX Runtime engine over another, timed outside dossier's tuner, with the
sessions held either way the tuner holds them: ``kept`` (each loaded once, a 50 ms sleep before a
block that follows the other's) or ``fresh`` (a new session for every block, released after).

Two engines of a bundle (the baseline and the shipped one, production load options: graph
optimizations off, ORT's defaults otherwise), one input per shape of its validation set. In
``--rounds`` rounds per segment, order alternating, each engine runs a block: 2 untimed runs,
then ``--calls`` timed ones; a round's ratio is the baseline's block median over the shipped
engine's. ``--segments`` segments, kept and fresh in turn (the host's speed can change from one
minute to the next: a segment is compared with its neighbours). Per segment: the Hodges-Lehmann estimate of the ratio with the exact
95% signed-rank interval, each engine's median ms per inference. Writes ``--out``::

    python bench/pair_ratio.py BUNDLE [--rounds 8] [--calls 8] [--segments 6]
        [--out bench/results/pair-ratio.json]
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
sys.path.insert(0, str(ROOT))

PAUSE_S = 0.05
LEAD_IN = 2


def _session(path: Path) -> Any:
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    return ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])


def segment(paths: list[Path], feeds: list[dict[str, np.ndarray]], mode: str, rounds: int,
            calls: int) -> dict[str, Any]:
    """One segment: per round and engine, the block median of ms per call (sum over inputs)."""
    kept = [_session(p) for p in paths] if mode == "kept" else None
    ms: list[list[float]] = [[], []]
    last = None
    for r in range(rounds):
        for i in ((0, 1) if r % 2 == 0 else (1, 0)):
            if kept is not None:
                if last is not None and last != i:
                    time.sleep(PAUSE_S)
                s = kept[i]
            else:
                s = _session(paths[i])
            last = i
            for f in feeds:
                for _ in range(LEAD_IN):
                    s.run(None, f)
            t = []
            for _ in range(calls):
                t0 = time.perf_counter()
                for f in feeds:
                    s.run(None, f)
                t.append((time.perf_counter() - t0) * 1e3)
            ms[i].append(float(np.median(t)))
            del s
    from dossier.measure.timing import shift_interval

    logs = np.log(np.array(ms[0]) / np.array(ms[1]))
    est, lo, hi = shift_interval(logs, 0.95)
    return {"mode": mode, "rounds": rounds, "speedup": round(float(np.exp(est)), 4),
            "ci95": [round(float(np.exp(lo)), 4), round(float(np.exp(hi)), 4)],
            "baseline_ms": round(float(np.median(ms[0])) / len(feeds), 3),
            "shipped_ms": round(float(np.median(ms[1])) / len(feeds), 3),
            "ratio_of_medians": round(float(np.median(ms[0]) / np.median(ms[1])), 4)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("bundle", type=Path)
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--calls", type=int, default=8)
    ap.add_argument("--segments", type=int, default=6)
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "pair-ratio.json")
    args = ap.parse_args()
    from dossier.bundle import open_bundle
    from dossier.validation import load_validation_set

    with open_bundle(args.bundle) as b:
        m = b.manifest
        shipped, baseline = m.engines.shipped, m.engines.baseline
        if baseline is None or baseline.path == shipped.path:
            raise SystemExit("error: the bundle has no baseline engine apart from the shipped one")
        paths = [b.path / baseline.path, b.path / shipped.path]
        vset = load_validation_set(b.path / "validation")
        feeds = [dict(g[0].inputs) for g in vset.timing_groups("shapes")]
        load = os.getloadavg()
        segments = [segment(paths, feeds, mode, args.rounds, args.calls)
                    for mode in ["kept", "fresh"] * (args.segments // 2)
                    + ["kept"] * (args.segments % 2)]
    doc = {"command": " ".join(["python bench/pair_ratio.py", *sys.argv[1:]]),
           "started": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
           "bundle": m.name, "baseline_route": baseline.route, "shipped_route": shipped.route,
           "cores": os.cpu_count(), "load_before": load, "segments": segments}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(doc, indent=2) + "\n")
    for s in segments:
        print(json.dumps(s))


if __name__ == "__main__":
    main()
