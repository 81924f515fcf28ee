"""Engine instances on the GPU: the server scenario's highest rate meeting the p99 bound for
dossier's AOTInductor CUDA-graph bundle served by 1, 2 and 4 engine instances
(``-serving_sessions``: the package loaded once per instance, each with its own CUDA stream and
its own graph), and whether instances called at once answer what one instance answers alone::

    OUT=DIR python bench/scenario_instances.py --configs resnet50_b1 --out $OUT/x.json --md $OUT/x.md

For each configuration (``bench/h200/make_specs.py``'s exported program and validation inputs)
the bundle is the one ``bench/scenario_gpu.py`` serves (a release pinning
``-cuda_graph=on -device=cuda -dtype=bfloat16``, reused when a warm machine has it). N
instances are N :func:`dossier.load` calls of it, which is what
:func:`dossier.scenarios.pool.load_sessions` does for a route with ``-serving_sessions=N``;
LoadGen's server scenario is answered by one worker thread per instance
(:func:`dossier.scenarios.driver.run`), the search for the highest rate is
:func:`dossier.scenarios.search.highest_rate`, whether a rate is met
:meth:`~dossier.scenarios.logs.LoadGenRun.meets` (at most 1 % of the queries over the bound):
the harness of ``bench/scenario_gpu.py``, every LoadGen run in this process.

Rules fixed before the runs: the p99 bounds are ``scenario_gpu.BOUNDS`` (5 ms ResNet-50 b1,
6 ms BERT b1); ``--reps`` searches per instance count, the order alternating (1 2 4, 4 2 1...),
the LoadGen schedule seed the repetition's index; the figure per count is the median of its
searches with the range. Correct: every output of N instances called at once from N threads
(``--rounds`` passes over the validation inputs each) equals, bit for bit, the output of one
instance called alone on the same input; the largest difference is recorded either way.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import threading
import time
import traceback
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
for p in (ROOT, ROOT / "bench", ROOT / "bench" / "h200"):
    if str(p) not in sys.path:
        sys.path.insert(0, str(p))

import scenario_gpu as sg  # noqa: E402


def _concurrent(engines: list[Any], feeds: list[dict], want: list[dict], rounds: int
                ) -> dict[str, Any]:
    """Every engine called at once from a thread of its own, ``rounds`` passes over ``feeds``;
    each output compared with ``want`` (one instance alone)."""
    import numpy as np

    start = threading.Barrier(len(engines))
    diffs: list[float] = []
    errors: list[str] = []
    lock = threading.Lock()

    def serve(engine: Any) -> None:
        try:
            start.wait()
            for _ in range(rounds):
                for i, feed in enumerate(feeds):
                    got = engine(feed)
                    d = max(float(np.max(np.abs(got[k].astype(np.float64)
                                                - want[i][k].astype(np.float64))))
                            for k in want[i])
                    with lock:
                        diffs.append(d)
        except Exception as exc:  # noqa: BLE001 - recorded
            errors.append(f"{type(exc).__name__}: {exc}"[:300])
    t0 = time.monotonic()
    threads = [threading.Thread(target=serve, args=(e,)) for e in engines]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return {"instances": len(engines), "calls": len(diffs), "errors": errors,
            "max_abs_diff": max(diffs) if diffs else None,
            "bitwise_equal": bool(diffs) and not errors and max(diffs) == 0.0,
            "wall_s": round(time.monotonic() - t0, 2)}


def _summary(searches: list[dict]) -> dict[str, Any] | None:
    qps = [s["metric_qps"] for s in searches if "metric_qps" in s]
    if not qps:
        return None
    med = statistics.median(qps)
    return {"qps_per_rep": qps, "median_qps": med, "min_qps": min(qps), "max_qps": max(qps)}


def markdown(doc: dict) -> str:
    env = doc.get("env", {})
    st = doc["settings"]
    lines = [f"# Engine instances under the server scenario: {env.get('card', '?')} "
             f"({env.get('gpu', '?')})", "",
             f"Command: `{doc['command']}`. torch {env.get('torch')}, driver "
             f"{env.get('nvidia_smi', '?')}, started {doc['started']}. Route "
             f"`{st['route']}`; each LoadGen run at least {st['duration_s']} s and "
             f"{st['min_queries']} queries, searches of at most {st['steps']} runs, "
             f"{st['reps']} per instance count, order alternating.", "",
             "| model | p99 bound | instances | outputs of instances at once vs one alone | "
             "highest QPS meeting the bound, per search | median | over 1 instance |",
             "|---|---|---|---|---|---|---|"]
    for config, rec in doc["configs"].items():
        one = (rec.get("instances", {}).get("1", {}).get("summary") or {}).get("median_qps")
        for n, inst in rec.get("instances", {}).items():
            sm = inst.get("summary")
            check = inst.get("concurrent") or {}
            same = "-" if n == "1" else (
                f"{check.get('calls')} calls, bitwise equal" if check.get("bitwise_equal")
                else f"{check.get('calls')} calls, max diff {check.get('max_abs_diff')}, "
                     f"errors {len(check.get('errors', []))}")
            if sm:
                ratio = f"{sm['median_qps'] / one:.2f}x" if one else "-"
                lines.append(f"| {config} | {rec['bound_ms']} ms | {n} | {same} | "
                             f"{', '.join(f'{q:.0f}' for q in sm['qps_per_rep'])} | "
                             f"**{sm['median_qps']:.0f}** | {ratio} |")
            else:
                lines.append(f"| {config} | {rec['bound_ms']} ms | {n} | {same} | "
                             f"{inst.get('error', 'not measured')} | - | - |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--md", type=Path)
    p.add_argument("--work", type=Path, default=ROOT / "bench" / "work" / "scenario-gpu")
    p.add_argument("--specs-work", type=Path, default=ROOT / "bench" / "work" / "h200")
    p.add_argument("--configs", default="resnet50_b1")
    p.add_argument("--instances", default="1,2,4")
    p.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--rounds", type=int, default=50, help="concurrent passes per instance")
    p.add_argument("--duration-s", type=float, default=2.0)
    p.add_argument("--min-queries", type=int, default=400)
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--deadline-s", type=float, default=540.0)
    p.add_argument("--switch-interval-ms", type=float, default=None,
                   help="sys.setswitchinterval for this process (Python's default: 5 ms, the "
                        "longest a thread waiting for the GIL may wait)")
    p.add_argument("--smoke", action="store_true", help="tiny settings")
    args = p.parse_args(argv)
    if args.switch_interval_ms is not None:
        sys.setswitchinterval(args.switch_interval_ms / 1000.0)
    t_start = time.monotonic()
    if args.smoke:
        args.duration_s, args.min_queries, args.steps, args.reps, args.rounds = 0.5, 50, 3, 1, 3
    configs = [c for c in args.configs.split(",") if c]
    counts = [int(n) for n in args.instances.split(",") if n]
    route = sg.ROUTES[args.device].format(dtype=args.dtype)
    doc: dict[str, Any] = {
        "command": "python bench/scenario_instances.py " + " ".join(
            argv if argv is not None else sys.argv[1:]),
        "started": sg._now(),
        "bounds_chosen_before_measuring": {c: sg.BOUNDS[c] for c in configs},
        "settings": {"duration_s": args.duration_s, "min_queries": args.min_queries,
                     "steps": args.steps, "reps": args.reps, "rounds": args.rounds,
                     "route": route, "instances": counts,
                     "switch_interval_ms": sys.getswitchinterval() * 1000.0},
        "configs": {c: {"bound_ms": sg.BOUNDS[c], "instances": {}} for c in configs}}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    sg._write(args.out, doc)
    from make_specs import CONFIGS, TINY_CONFIGS, write_config

    import dossier

    doc["env"] = sg._env(args.device)
    table = {**CONFIGS, **TINY_CONFIGS}
    for c in configs:
        rec = doc["configs"][c]
        try:
            factory, batch = table[c]
            write_config(args.specs_work, c, factory, batch, device=args.device,
                         ref_device=args.device, dtype=args.dtype, pairs=2,
                         tiny=c in TINY_CONFIGS, force=False)
            out = args.work / "bundles" / c
            if sg._bundle_path(out) is None:
                t0 = time.monotonic()
                spec = sg._release_spec(args.specs_work / "specs" / c, c, route)
                log = args.work / f"release-{c}.log"
                rc = sg._start_release(spec, out, log).wait()
                rec["release_s"], rec["release_rc"] = round(time.monotonic() - t0, 1), rc
            bundle = sg._bundle_path(out)
            if bundle is None:
                raise RuntimeError(f"no bundle: {(args.work / f'release-{c}.log').read_text()[-800:]}")
            feeds = sg._feeds(args.specs_work / "specs" / c)
            engines = [dossier.load(bundle) for _ in range(max(counts))]
            rec["loaded"] = f"{max(counts)} x dossier.load({bundle.name}): shipped route " \
                            f"{engines[0].route}"
            calls = [sg._engine_call(e) for e in engines]
            rec["single"] = sg._single(calls[0], feeds)
            want = [calls[0](f) for f in feeds]
            for n in counts:
                rec["instances"][str(n)] = {"searches": []}
                for call in calls[:n]:  # each instance warmed up (its graph captured)
                    for f in feeds:
                        call(f)
                if n > 1:
                    rec["instances"][str(n)]["concurrent"] = _concurrent(
                        calls[:n], feeds, want, args.rounds)
            print(json.dumps({c: {n: i.get("concurrent") for n, i in rec["instances"].items()}}),
                  flush=True)
            sg._write(args.out, doc)
        except Exception as exc:  # noqa: BLE001 - recorded
            rec["error"] = f"{type(exc).__name__}: {str(exc)[:600]}"
            print(traceback.format_exc(), flush=True)
            continue
        for rep in range(args.reps):
            for n in (counts if rep % 2 == 0 else list(reversed(counts))):
                inst = rec["instances"][str(n)]
                if time.monotonic() - t_start > args.deadline_s:
                    inst["searches"].append({"rep": rep, "skipped": "deadline"})
                    continue
                try:
                    s = sg._search(calls[:n], feeds, rec["single"]["single_ms"], sg.BOUNDS[c],
                                   args.duration_s, args.min_queries, args.steps, rep,
                                   args.work / "instances" / c / f"n{n}-rep{rep}")
                    inst["searches"].append({"rep": rep, **s})
                    print(f"{c} rep {rep}: {n} instance(s): {s['metric_qps']} QPS", flush=True)
                except Exception as exc:  # noqa: BLE001 - recorded
                    inst["searches"].append({"rep": rep, "error": f"{type(exc).__name__}: "
                                                                  f"{str(exc)[:400]}"})
                    print(traceback.format_exc(), flush=True)
                inst["summary"] = _summary(inst["searches"])
                sg._write(args.out, doc)
    doc["finished"] = sg._now()
    doc["wall_s"] = round(time.monotonic() - t_start, 1)
    sg._write(args.out, doc)
    if args.md:
        args.md.write_text(markdown(doc))
    print(markdown(doc), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
