"""Where does the in-process A/A bias come from? One factor at a time, on ONNX Runtime (CPU).

Times the A/A pair (the baseline engine of a sample loaded twice in one process) the way a
trial timed engines before rounds became the unit of replication (warm-up each, then blocks of
``--block`` samples alternating A B / B A with 2 untimed runs per block) and varies one factor
at a time against that reference configuration:

- ``spin``: session.force_spinning_stop on (the old timing load) or off (ORT's default);
- ``threads``: intra-op threads 0 (ORT default: one per core) or 1;
- ``block``: timed samples per block (6 as before, or long steady-state blocks);
- ``lead``: untimed lead-in runs per block;
- ``pause``: ms of sleep before a block that follows the other session's (sessions kept open,
  the tuner's mode for engines that load slower than ``SearchTraits.switch_pause_s``);
- ``lead_ms``: lead-in runs go on until this many ms have passed (the other session's threads
  spin out while this one runs untimed).

Every configuration runs in ``--repeats`` fresh processes. Each round gives two paired
statistics: the ratio of block medians second-created / first-created session (> 1: the session
created first is faster) and second-in-block / first-in-block (> 1: the engine that runs first in
a block is faster). Reported per configuration: the median over rounds with a 95% bootstrap
interval over rounds, the number of rounds, and how many rounds were above 1. Writes
bench/results/timing-bias.json with the machine load (os.getloadavg) before and after.

    python bench/bias_check.py [--sample tblock] [--repeats 3] [--rounds 10]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

REFERENCE = {"spin": 1, "threads": 0, "block": 6, "lead": 2, "fresh": 0, "pause": 0, "lead_ms": 0}
VARIANTS = [("reference", {}), ("spin off", {"spin": 0}), ("1 thread", {"threads": 1}),
            ("1 thread, spin off", {"threads": 1, "spin": 0}),
            ("block 60", {"block": 60}), ("block 60, spin off", {"block": 60, "spin": 0}),
            ("no lead-in", {"lead": 0}),
            ("fresh session per block, spin off", {"fresh": 1, "spin": 0, "lead": 5}),
            ("fresh, spin off, block 60", {"fresh": 1, "spin": 0, "lead": 5, "block": 60}),
            ("new procedure", {"fresh": 1, "spin": 0, "lead": 5, "block": 20}),
            ("kept, no pause", {"spin": 0, "lead": 5, "block": 20}),
            ("kept, 50 ms pause", {"spin": 0, "lead": 5, "block": 20, "pause": 50}),
            ("kept, 50 ms lead-in", {"spin": 0, "lead": 5, "block": 20, "lead_ms": 50})]


def child(engine: str, validation: str, cfg: dict, rounds: int) -> dict:
    """Runs in a fresh process: two sessions over ``engine``, timed as configured."""
    import onnxruntime as ort

    from dossier.validation import load_validation_set

    vset = load_validation_set(Path(validation))

    def session():  # type: ignore[no-untyped-def]
        if cfg["fresh"]:  # a new session for every block, released after it: one at a time
            def fresh_run() -> float:
                return holder[0]()
            holder: list = []

            def renew() -> None:
                holder.clear()
                holder.append(_session())
            fresh_run.renew = renew  # type: ignore[attr-defined]
            fresh_run.drop = holder.clear  # type: ignore[attr-defined]
            return fresh_run
        return _session()

    def _session():  # type: ignore[no-untyped-def]
        so = ort.SessionOptions()
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
        so.intra_op_num_threads = cfg["threads"]
        if cfg["spin"]:
            so.add_session_config_entry("session.force_spinning_stop", "1")
        s = ort.InferenceSession(engine, so, providers=["CPUExecutionProvider"])
        outs = [o.name for o in s.get_outputs()]
        feeds = [dict(p.inputs) for p in vset.pairs]

        def run() -> float:
            t0 = time.perf_counter_ns()
            for f in feeds:
                s.run(outs, f)
            return (time.perf_counter_ns() - t0) / 1e6
        return run

    first, second = session(), session()
    for fn in (first, second):  # warm-up as the trials did: one engine, then the other
        if cfg["fresh"]:
            fn.renew()
        for _ in range(20):
            fn()
        if cfg["fresh"]:
            fn.drop()
    rows = []
    last = None
    for r in range(rounds):
        order = [first, second] if r % 2 == 0 else [second, first]
        med = {}
        for fn in order:
            if cfg["pause"] and last is not None and last is not fn:
                time.sleep(cfg["pause"] / 1000)
            last = fn
            if cfg["fresh"]:
                fn.renew()
            t_lead = time.perf_counter()
            for _ in range(cfg["lead"]):
                fn()
            while (time.perf_counter() - t_lead) * 1e3 < cfg["lead_ms"]:
                fn()
            med[id(fn)] = float(np.median([fn() for _ in range(cfg["block"])]))
            if cfg["fresh"]:
                fn.drop()
        rows.append({"created": med[id(second)] / med[id(first)],
                     "position": med[id(order[1])] / med[id(order[0])],
                     "first_ms": med[id(first)], "second_ms": med[id(second)]})
    return {"rounds": rows}


def _summary(ratios: list[float]) -> dict:
    from scipy import stats

    x = np.log(np.asarray(ratios))
    res = stats.bootstrap((x,), np.median, n_resamples=2000, confidence_level=0.95,
                          method="percentile", rng=np.random.default_rng(0))
    p = float(stats.wilcoxon(x).pvalue) if len(x) >= 6 else None
    return {"median": float(np.exp(np.median(x))),
            "ci": [float(np.exp(res.confidence_interval.low)),
                   float(np.exp(res.confidence_interval.high))],
            "n_rounds": len(x), "above_1": int((x > 0).sum()), "wilcoxon_p": p}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sample", default="tblock")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--only", nargs="*", help="variant names to run (default: all)")
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "timing-bias.json")
    ap.add_argument("--child", nargs=3, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(child(args.child[0], args.child[1], json.loads(args.child[2]),
                               args.rounds)))
        return
    from dossier.backends import get_backend
    from dossier.spec import load_spec

    spec = load_spec(ROOT / "samples" / args.sample / "release.toml")
    backend = get_backend("onnxruntime")
    from dossier.routes import Selection

    db = backend.knob_database()
    baseline = Selection.parse(spec.tune.selection, db).baseline(db)
    load_before = os.getloadavg()
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        engine = Path(tmp) / "baseline.ort"
        backend.build(spec.model_path(), baseline, engine)
        validation = str(spec.resolve(spec.validation.path))
        variants = [v for v in VARIANTS if not args.only or v[0] in args.only]
        raw: dict[str, list] = {name: [] for name, _ in variants}
        for rep in range(args.repeats):  # configurations interleaved over repeats
            for name, change in variants:
                cfg = {**REFERENCE, **change}
                out = subprocess.run(  # noqa: S603 - this script, in a fresh interpreter
                    [sys.executable, __file__, "--rounds", str(args.rounds), "--child",
                     str(engine), validation, json.dumps(cfg)],
                    capture_output=True, text=True, check=True)
                raw[name].extend(json.loads(out.stdout)["rounds"])
                print(f"[{rep}] {name}: done", file=sys.stderr)
        for name, change in variants:
            rows = raw[name]
            results[name] = {"config": {**REFERENCE, **change},
                             "second_over_first_created": _summary([r["created"] for r in rows]),
                             "second_over_first_in_block": _summary([r["position"] for r in rows]),
                             "median_ms": float(np.median([r["first_ms"] for r in rows]))}
    load_after = os.getloadavg()
    result = {"benchmark": "in-process A/A bias, one factor at a time", "sample": args.sample,
              "engine": "baseline route, built by dossier", "repeats": args.repeats,
              "rounds_per_process": args.rounds,
              "host": {"machine": platform.machine(), "cpus": os.cpu_count(),
                       "loadavg_before": load_before, "loadavg_after": load_after,
                       "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())},
              "results": results}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    for name, r in results.items():
        c, p = r["second_over_first_created"], r["second_over_first_in_block"]
        print(f"{name:22s} created 2nd/1st {c['median']:.3f} [{c['ci'][0]:.3f}, {c['ci'][1]:.3f}] "
              f"({c['above_1']}/{c['n_rounds']} >1)   in-block 2nd/1st {p['median']:.3f} "
              f"[{p['ci'][0]:.3f}, {p['ci'][1]:.3f}] ({p['above_1']}/{p['n_rounds']} >1)  "
              f"{r['median_ms']:.2f} ms")


if __name__ == "__main__":
    main()
