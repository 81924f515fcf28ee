"""The server scenario on the GPU machine: dossier's AOTInductor engine (the CUDA-graph route
the GPU releases ship) against ``torch.compile(mode="reduce-overhead")`` of the same model, both
served by the same LoadGen harness, ResNet-50 and BERT-base at batch 1 in bf16::

    OUT=DIR python bench/scenario_gpu.py --out $OUT/scenario-gpu.json --md $OUT/scenario-gpu.md

For each configuration (``bench/h200/make_specs.py``'s exported program, validation inputs and
seeded random weights):

- **dossier**: a bundle released from a spec that pins the route
  ``-cuda_graph=on -device=cuda -dtype=bfloat16`` (one route, so the release ships it; ``dossier
  release`` in a child process: export, AOTInductor build, timing, bundle), loaded the
  production way, :func:`dossier.load` (verify, then load the shipped engine as timed: the
  package replayed as a CUDA graph over static buffers). ``--no-bundle``, or a release that
  fails: the backend's ``build`` and ``load`` with the route (the results say which).
- **torch.compile**: ``torch.compile(module, mode="reduce-overhead")`` of the same module
  (bf16 compute behind a float32 interface, :func:`dossier.backends.torch_inductor.wrap_module`,
  as the exported program), compiled in this process.

Each query is one call on one validation input: host arrays in, host arrays out, both engines
(dossier's ``Engine`` call; for torch.compile ``torch.from_numpy(x).to("cuda")``, the call, the
outputs ``.float().cpu().numpy()``), under ``torch.no_grad()``. The harness is dossier's:
:func:`dossier.scenarios.driver.run` (LoadGen's server scenario, one worker thread answering
the queries one at a time, the single stream of issue the driver has),
:func:`dossier.scenarios.search.highest_rate` (the rate doubles while the bound holds, halves
while it does not, then bisects to 5 %), :meth:`~dossier.scenarios.logs.LoadGenRun.meets`
(at most 1 % of the queries over the bound, no error, the completed rate kept up), the first
rate from :func:`~dossier.scenarios.search.start_rate` of the engine's own single-inference
time. Unlike a release's scenario stage, every LoadGen run here runs in this process (the
package runs each in a child process): a torch.compile model would be compiled again in each.

CUDA-graph trees (reduce-overhead) keep their graphs per Python thread: the driver's worker
thread, new in every LoadGen run, would warm up and record the graphs again in its first
queries. The torch.compile call therefore gives a thread that has none the main thread's tree
manager (what torch does for its autograd threads), and the results record each engine's first
calls in a fresh thread. dossier's engine replays one ``torch.cuda.CUDAGraph`` from any thread.

The p99 bounds are fixed here (``BOUNDS``) before anything is measured, the same for both
engines of a model. ``--reps`` searches per engine, the order alternating (A B, B A, A B...),
the LoadGen schedule seed the repetition's index (both engines of a repetition get the same
arrival times). Eager's single-inference time is measured for context (not served).
``--device cpu --configs tiny_mlp_b8 --dtype float32 --smoke`` runs the pipeline on a CPU.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import statistics
import subprocess
import sys
import tarfile
import threading
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
for p in (ROOT, ROOT / "bench" / "h200"):
    if str(p) not in sys.path:
        sys.path.insert(0, str(p))

BOUNDS = {"resnet50_b1": 5.0, "bert_b1": 6.0, "tiny_mlp_b8": 50.0, "tiny_convnet_b4": 50.0}
"""The p99 latency bound per configuration (ms), chosen before any measurement: about 4-5
times the slower engine's single-inference time in the earlier H200 timings (ResNet-50 b1:
torch.compile reduce-overhead 1.12 ms, the CUDA-graph AOTInductor engine 0.79 ms; BERT b1:
1.51 and 1.12 ms, device-resident inputs), leaving room for the copies through the host."""
PERCENTILE = 99.0
ROUTES = {"cuda": "-cuda_graph=on -device=cuda -dtype={dtype}",
          "cpu": "-device=cpu -dtype={dtype}"}
"""The dossier engine's route: the CUDA-graph route the GPU releases shipped (bench/results/
h200.md), its other knobs at their defaults."""
SERVE_TIMING = {"samples": 20, "rounds": 6, "warmup_max_s": 1.0, "confirm_top": 1,
                "trial_timeout_s": 300.0}
"""The bundle's release timing (one route, nothing to compare: kept short)."""
SINGLE_CALLS = 50
WARMUP_CALLS = 20
THREAD_CALLS = 5

DOSSIER = "dossier (AOTInductor, CUDA graph)"
COMPILE = 'torch.compile(mode="reduce-overhead")'


def _now() -> str:
    return dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")


def _write(path: Path, doc: dict) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(doc, indent=2) + "\n")
    tmp.replace(path)


def _env(device: str) -> dict[str, Any]:
    import importlib.metadata as md

    import torch

    rec: dict[str, Any] = {"python": platform.python_version(), "torch": torch.__version__,
                           "torch_cuda": torch.version.cuda, "cpus": os.cpu_count()}
    if device == "cuda":
        rec["gpu"] = torch.cuda.get_device_name(0)
        rec["card"] = "H200" if "H200" in rec["gpu"] else "H100" if "H100" in rec["gpu"] \
            else rec["gpu"]
        try:
            rec["nvidia_smi"] = subprocess.run(
                ["nvidia-smi", "--query-gpu=name,driver_version,clocks.sm,power.limit",
                 "--format=csv,noheader"], capture_output=True, text=True,
                timeout=20).stdout.strip()
        except (OSError, subprocess.SubprocessError) as exc:
            rec["nvidia_smi"] = f"failed: {exc}"
    for name in ("mlcommons-loadgen", "pydantic", "triton", "transformers", "torchvision"):
        try:
            rec[name] = md.version(name)
        except md.PackageNotFoundError:  # noqa: PERF203
            rec[name] = None
    try:
        rec["commit"] = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"],
                                       capture_output=True, text=True).stdout.strip() or None
    except OSError:
        rec["commit"] = None
    return rec


# ------------------------------------------------------------------------------ engines
def _release_spec(folder: Path, config: str, route: str) -> Path:
    from make_specs import spec_text

    spec = folder / "release-serve.toml"
    spec.write_text(spec_text(f"serve-{config}", f"scenario bench: {config}, route pinned",
                              route, SERVE_TIMING, 1e-3), encoding="utf-8")
    return spec


def _start_release(spec: Path, out: Path, log: Path) -> subprocess.Popen:
    out.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "dossier_cli.main", "release", str(spec), "--out", str(out),
           "--json", "--quiet"]
    return subprocess.Popen(cmd, stdout=open(log, "wb"), stderr=subprocess.STDOUT)


def _bundle_path(out: Path) -> Path | None:
    found = sorted(out.glob("*.dossier"))
    return found[-1] if found else None


def _feeds(folder: Path) -> list[dict[str, Any]]:
    from dossier.validation import load_validation_set

    return [p.inputs for p in load_validation_set(folder / "validation").pairs]


def _module(config_meta: dict, device: str) -> tuple[Any, Any]:
    """The wrapped module (what the exported program computes) and its signature."""
    from dossier.backends.torch_inductor.model import signature_from_dict, wrap_module
    from samples import torch_models

    factory = torch_models.FACTORIES[config_meta["factory"]]
    sig_dict = torch_models.fixed_signature(factory.signature, config_meta["batch"])  # type: ignore[attr-defined]
    sig = signature_from_dict(sig_dict, config_meta["config"])
    module = wrap_module(factory().eval().to(device), config_meta["dtype"], sig)
    return module, sig


def _torch_call(fn: Any, sig: Any, device: str, share_graph_trees: bool) -> Callable[[dict], dict]:
    """One query on a torch callable: host arrays in, host arrays out, no_grad; with
    ``share_graph_trees`` a thread without CUDA-graph trees of its own uses this thread's."""
    import numpy as np
    import torch

    names = [t.name for t in sig.inputs]
    outs = [t.name for t in sig.outputs]
    share = None
    if share_graph_trees and device == "cuda":
        try:
            from torch._inductor import cudagraph_trees as cgt

            share = (cgt, cgt.get_obj(cgt.local, "tree_manager_containers"),
                     cgt.get_obj(cgt.local, "tree_manager_locks"))
        except (ImportError, AttributeError):
            share = None

    def call(feed: dict) -> dict:
        if share is not None and not hasattr(share[0].local, "tree_manager_containers"):
            share[0].local.tree_manager_containers = share[1]
            share[0].local.tree_manager_locks = share[2]
        with torch.no_grad():
            args = tuple(torch.from_numpy(np.ascontiguousarray(feed[n])).to(device)
                         for n in names)
            flat = fn(*args)
            if isinstance(flat, dict):
                flat = [flat[n] for n in outs]
            return {n: o.detach().float().cpu().numpy() for n, o in zip(outs, flat)}
    call.shares_graph_trees = share is not None  # type: ignore[attr-defined]
    return call


def _engine_call(engine: Any) -> Callable[[dict], dict]:
    import torch

    def call(feed: dict) -> dict:
        with torch.no_grad():
            return engine(feed)
    return call


def _single(call: Callable[[dict], dict], feeds: list[dict]) -> dict[str, Any]:
    """Warm up, then the median of single calls back to back (host clock, as the scenario's
    child measures its floor); and the first calls in a thread of their own."""
    for i in range(WARMUP_CALLS):
        call(feeds[i % len(feeds)])
    times = []
    for i in range(SINGLE_CALLS):
        t0 = time.perf_counter_ns()
        call(feeds[i % len(feeds)])
        times.append((time.perf_counter_ns() - t0) / 1e6)
    fresh: list[float] = []
    errors: list[str] = []

    def in_thread() -> None:
        try:
            for i in range(THREAD_CALLS):
                t0 = time.perf_counter_ns()
                call(feeds[i % len(feeds)])
                fresh.append(round((time.perf_counter_ns() - t0) / 1e6, 4))
        except Exception as exc:  # noqa: BLE001 - recorded
            errors.append(f"{type(exc).__name__}: {exc}"[:300])
    t = threading.Thread(target=in_thread)
    t.start()
    t.join()
    return {"single_ms": round(statistics.median(times), 4),
            "single_ms_p90": round(sorted(times)[int(0.9 * len(times))], 4),
            "fresh_thread_first_calls_ms": fresh, "fresh_thread_error": errors[0] if errors
            else None}


# ------------------------------------------------------------------------------ search
def _search(calls: list[Callable[[dict], dict]], feeds: list[dict], single_ms: float,
            bound_ms: float, duration_s: float, min_queries: int, steps: int, seed: int,
            work: Path) -> dict[str, Any]:
    """The highest rate meeting the bound: dossier's search over dossier's driver, every
    LoadGen run in this process, the queries answered by one worker thread per call."""
    from dossier.scenario import ScenarioSection
    from dossier.scenarios import driver
    from dossier.scenarios.models import Probe, RunSettings, ScenarioResult
    from dossier.scenarios.search import _max_duration, highest_rate, start_rate

    scenario = ScenarioSection(kind="server", latency_ms=bound_ms, percentile=PERCENTILE,
                               duration_s=duration_s, min_queries=min_queries,
                               search_steps=steps, processes=5, run_timeout_s=60)
    n = [0]

    def answerer(call: Callable[[dict], dict]) -> Callable[[list[int]], object]:
        return lambda indices: call(feeds[indices[0] % len(feeds)])  # one query per call
    answers = [answerer(c) for c in calls]

    def probe(qps: float) -> Probe:
        settings = RunSettings(kind="server", qps=qps, bound_ns=scenario.bound_ns,
                               percentile=PERCENTILE, duration_s=duration_s,
                               min_queries=min_queries,
                               max_duration_s=_max_duration(scenario, qps), seed=seed)
        folder = work / f"run-{n[0]:02d}"
        n[0] += 1
        t0 = time.monotonic()
        run = driver.run(answers, len(feeds), settings, folder)
        p = Probe(qps=qps, met=run.meets(scenario.bound_ns, PERCENTILE), run=run,
                  single_ms=single_ms)
        print(f"    {qps:9.1f} QPS: {'met   ' if p.met else 'missed'} p99 "
              f"{run.latency_ms('99.00')} ms, completed {run.completed_qps} QPS, "
              f"{run.query_count} queries, LoadGen {run.loadgen_result} "
              f"({time.monotonic() - t0:.1f} s)", flush=True)
        return p

    start = start_rate(single_ms, len(calls), os.cpu_count() or 1)
    t0 = time.monotonic()
    met, missed, probes = highest_rate(probe, start, steps)
    result = ScenarioResult(kind="server", metric_qps=met, lowest_missed_qps=missed,
                            probes=probes)
    at = result.at_metric()
    return {"metric_qps": round(met, 2),
            "lowest_missed_qps": None if missed is None else round(missed, 2),
            "start_qps": round(start, 2), "seed": seed, "wall_s": round(time.monotonic() - t0, 1),
            "at_metric": _probe(at) if at else None,
            "probes": [_probe(p) for p in probes]}


def _probe(p: Any) -> dict[str, Any]:
    run = p.run
    return {"qps": round(p.qps, 2), "met": p.met,
            "completed_qps": run.completed_qps if run else None,
            "p50_ms": run.latency_ms("50.00") if run else None,
            "p90_ms": run.latency_ms("90.00") if run else None,
            "p99_ms": run.latency_ms("99.00") if run else None,
            "max_ms": run.latency_ms("max") if run else None,
            "late_share": round(run.overlatency_count / run.query_count, 5)
            if run and run.overlatency_count is not None and run.query_count else None,
            "queries": run.query_count if run else None,
            "loadgen_result": run.loadgen_result if run else None,
            "loadgen_invalid_reason": run.loadgen_invalid_reason if run else None}


# ------------------------------------------------------------------------------ summary
def summarize(doc: dict) -> None:
    for rec in doc["configs"].values():
        for eng in rec.get("engines", {}).values():
            runs = [r for r in eng.get("searches", []) if "metric_qps" in r]
            if not runs:
                continue
            qps = [r["metric_qps"] for r in runs]
            med = statistics.median(qps)
            # the repetition whose rate is the median (the middle one of an odd count)
            mid = sorted(runs, key=lambda r: r["metric_qps"])[(len(runs) - 1) // 2]
            eng["summary"] = {"qps_per_rep": qps, "median_qps": med, "min_qps": min(qps),
                              "max_qps": max(qps),
                              "spread_pct": round(100 * (max(qps) - min(qps)) / med, 1)
                              if med else None,
                              "median_rep": mid["rep"], "at_median": mid.get("at_metric")}
        s = {n: e.get("summary") for n, e in rec.get("engines", {}).items()}
        if s.get(DOSSIER) and s.get(COMPILE) and s[COMPILE]["median_qps"]:
            rec["dossier_over_compile_median_qps"] = round(
                s[DOSSIER]["median_qps"] / s[COMPILE]["median_qps"], 3)


def merge(paths: list[Path]) -> dict:
    """The results files of several calls (one configuration each, on one machine) as one."""
    docs = [json.loads(Path(p).read_text()) for p in paths]
    gpus = {d.get("env", {}).get("gpu") for d in docs}
    out: dict[str, Any] = {
        "format": "scenario-gpu/1", "command": [d["command"] for d in docs],
        "started": docs[0]["started"], "finished": docs[-1].get("finished"),
        "calls": [{"command": d["command"], "started": d["started"],
                   "finished": d.get("finished"), "wall_s": d.get("wall_s"),
                   "configs": list(d["configs"]), "env": d.get("env")} for d in docs],
        "env": docs[0].get("env", {}), "same_gpu_in_every_call": len(gpus) == 1,
        "settings": docs[0]["settings"], "bounds_chosen_before_measuring": {},
        "configs": {}}
    for d in docs:
        out["bounds_chosen_before_measuring"].update(d["bounds_chosen_before_measuring"])
        out["configs"].update(d["configs"])
    summarize(out)
    return out


def _ms(v: Any) -> str:
    return "-" if v is None else f"{v:.2f}"


def markdown(doc: dict) -> str:
    env = doc.get("env", {})
    commands = doc["command"] if isinstance(doc["command"], list) else [doc["command"]]
    st = doc["settings"]
    lines = [f"# Server scenario on the GPU machine: {env.get('card', '?')} "
             f"({env.get('gpu', '?')})", "",
             "Commands: " + "; ".join(f"`{c}`" for c in commands) + f". torch "
             f"{env.get('torch')}, LoadGen {env.get('mlcommons-loadgen')}, started "
             f"{doc['started']}. Each LoadGen run: at least {st['duration_s']} s and "
             f"{st['min_queries']} queries; a search of at most {st['steps']} runs; "
             f"{st['reps']} searches per engine, order alternating. Query: {st['query']}. "
             f"Harness: {st['harness']}.", "",
             "| model | p99 bound (chosen before) | engine | single inference, ms (median of "
             f"{SINGLE_CALLS}) | highest QPS meeting the bound, per search | median | spread "
             "(max-min)/median | at the median search's rate: p50 / p99 ms, LoadGen's result |",
             "|---|---|---|---|---|---|---|---|"]
    for config, rec in doc["configs"].items():
        bound = rec.get("bound_ms")
        for name, eng in rec.get("engines", {}).items():
            sm = eng.get("summary")
            single = eng.get("single", {}).get("single_ms")
            if sm:
                at = sm.get("at_median") or {}
                lines.append(
                    f"| {config} | {bound} ms | {name} | {_ms(single)} | "
                    f"{', '.join(f'{q:.0f}' for q in sm['qps_per_rep'])} | "
                    f"**{sm['median_qps']:.0f}** | {sm['spread_pct']} % | "
                    f"{_ms(at.get('p50_ms'))} / {_ms(at.get('p99_ms'))}, "
                    f"{at.get('loadgen_result')} |")
            else:
                lines.append(f"| {config} | {bound} ms | {name} | {_ms(single)} | "
                             f"{eng.get('error', 'not measured')} | - | - | - |")
        eager = rec.get("eager", {}).get("single_ms")
        lines.append(f"| {config} | - | eager (context, not served) | {_ms(eager)} | - | - | - "
                     "| - |")
        if rec.get("dossier_over_compile_median_qps"):
            lines.append(f"| {config} | | dossier over torch.compile, medians | | | "
                         f"**{rec['dossier_over_compile_median_qps']:.2f}x** | | |")
    lines += ["", "Per search, at its highest rate met: p50 / p99 ms, share of queries over the "
              "bound, LoadGen's own result (INVALID here: its early-stopping estimate wanted more "
              "queries than a 2 s run has; dossier's reading, at most 1 % over the bound, held):",
              ""]
    for config, rec in doc["configs"].items():
        for name, eng in rec.get("engines", {}).items():
            parts = []
            for s in eng.get("searches", []):
                at = s.get("at_metric")
                if at:
                    parts.append(f"rep {s['rep']}: {at['qps']:.0f} QPS, {_ms(at['p50_ms'])} / "
                                 f"{_ms(at['p99_ms'])}, {100 * (at['late_share'] or 0):.2f} %, "
                                 f"{at['loadgen_result']}")
                else:
                    parts.append(f"rep {s['rep']}: {s.get('error') or s.get('skipped') or 'none met'}")
            lines.append(f"- {config}, {name}: " + "; ".join(parts))
    lines += ["", "dossier engine loaded via: " + "; ".join(
        f"{c}: {r.get('dossier_loaded_via', '?')}" for c, r in doc["configs"].items()), ""]
    return "\n".join(lines) + "\n"


# ------------------------------------------------------------------------------ main
def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    p.add_argument("--out", type=Path, required=True, help="results JSON")
    p.add_argument("--md", type=Path, help="also a markdown table")
    p.add_argument("--work", type=Path, default=ROOT / "bench" / "work" / "scenario-gpu")
    p.add_argument("--specs-work", type=Path, default=ROOT / "bench" / "work" / "h200")
    p.add_argument("--configs", default="resnet50_b1,bert_b1")
    p.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--duration-s", type=float, default=2.0)
    p.add_argument("--min-queries", type=int, default=400)
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--no-bundle", action="store_true",
                   help="the backend's build and load instead of a released bundle")
    p.add_argument("--deadline-s", type=float, default=560.0,
                   help="searches that would start after this are skipped (recorded)")
    p.add_argument("--logs-tar", type=Path, help="LoadGen's summaries at each metric, tarred")
    p.add_argument("--smoke", action="store_true", help="tiny settings")
    p.add_argument("--merge", type=Path, nargs="+", metavar="JSON",
                   help="instead: merge the results files of several calls into --out (and --md)")
    args = p.parse_args(argv)
    if args.merge:
        merged = merge(args.merge)
        args.out.parent.mkdir(parents=True, exist_ok=True)
        _write(args.out, merged)
        if args.md:
            args.md.write_text(markdown(merged))
        print(markdown(merged))
        return 0
    t_start = time.monotonic()
    if args.smoke:
        args.duration_s, args.min_queries, args.steps, args.reps = 0.5, 50, 3, 2
    configs = [c for c in args.configs.split(",") if c]

    doc: dict[str, Any] = {
        "command": "python bench/scenario_gpu.py " + " ".join(
            argv if argv is not None else sys.argv[1:]),
        "started": _now(), "bounds_chosen_before_measuring": {
            c: {"latency_ms": BOUNDS[c], "percentile": PERCENTILE} for c in configs},
        "settings": {"duration_s": args.duration_s, "min_queries": args.min_queries,
                     "steps": args.steps, "reps": args.reps, "device": args.device,
                     "dtype": args.dtype,
                     "route": ROUTES[args.device].format(dtype=args.dtype),
                     "query": "one call on one validation input, host arrays in and out, "
                              "torch.no_grad()",
                     "harness": "dossier.scenarios.driver.run (1 worker thread) + "
                                "dossier.scenarios.search.highest_rate + LoadGenRun.meets, "
                                "every LoadGen run in this process"},
        "configs": {c: {"bound_ms": BOUNDS[c]} for c in configs}}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    _write(args.out, doc)  # the bounds, before anything is measured

    import torch
    from make_specs import CONFIGS, TINY_CONFIGS, write_config

    doc["env"] = _env(args.device)
    print(json.dumps(doc["env"]), flush=True)
    _write(args.out, doc)
    args.work.mkdir(parents=True, exist_ok=True)
    route = ROUTES[args.device].format(dtype=args.dtype)
    table = {**CONFIGS, **TINY_CONFIGS}

    # specs (exported programs, validation inputs)
    metas: dict[str, dict] = {}
    for c in configs:
        t0 = time.monotonic()
        factory, batch = table[c]
        try:
            metas[c] = write_config(args.specs_work, c, factory, batch, device=args.device,
                                    ref_device=args.device, dtype=args.dtype, pairs=2,
                                    tiny=c in TINY_CONFIGS, force=False)
        except Exception as exc:  # noqa: BLE001
            doc["configs"][c]["error"] = f"specs: {type(exc).__name__}: {exc}"[:500]
            print(traceback.format_exc(), flush=True)
        doc["configs"][c]["specs_s"] = round(time.monotonic() - t0, 1)
        print(f"specs {c}: {doc['configs'][c]['specs_s']} s", flush=True)
    _write(args.out, doc)

    # dossier's engines: releases in child processes, all at once (builds on the CPUs)
    releases: dict[str, tuple[subprocess.Popen, Path, Path, float]] = {}
    if not args.no_bundle:
        for c in metas:
            folder = args.specs_work / "specs" / c
            spec = _release_spec(folder, c, route)
            out = args.work / "bundles" / c
            if _bundle_path(out) is not None:  # a warm machine's earlier release
                continue
            log = args.work / f"release-{c}.log"
            releases[c] = (_start_release(spec, out, log), out, log, time.monotonic())
            print(f"release {c}: started", flush=True)

    # torch.compile(mode="reduce-overhead"), compiled meanwhile (first calls)
    compiled: dict[str, tuple[Any, Any, Any]] = {}
    for c in metas:
        try:
            module, sig = _module(metas[c], args.device)
            feeds = _feeds(args.specs_work / "specs" / c)
            t0 = time.monotonic()
            fn = torch.compile(module, mode="reduce-overhead")
            call = _torch_call(fn, sig, args.device, share_graph_trees=True)
            for i in range(3):
                call(feeds[i % len(feeds)])
            if args.device == "cuda":
                torch.cuda.synchronize()
            doc["configs"][c]["compile_s"] = round(time.monotonic() - t0, 2)
            doc["configs"][c]["compile_note"] = "compiled while the releases built (CPU shared)" \
                if releases else ""
            call = _torch_call(fn, sig, args.device, share_graph_trees=True)
            doc["configs"][c]["compile_shares_graph_trees"] = bool(call.shares_graph_trees)  # type: ignore[attr-defined]
            compiled[c] = (module, sig, call)
            print(f"torch.compile {c}: {doc['configs'][c]['compile_s']} s", flush=True)
        except Exception as exc:  # noqa: BLE001, PERF203
            doc["configs"][c].setdefault("engines", {})[COMPILE] = {
                "error": f"compile: {type(exc).__name__}: {str(exc)[:400]}"}
            print(traceback.format_exc(), flush=True)
    _write(args.out, doc)

    # wait for the releases, load the bundles
    import dossier

    engines: dict[str, Callable[[dict], dict]] = {}
    for c in metas:
        rec = doc["configs"][c]
        out = args.work / "bundles" / c
        if c in releases:
            proc, out, log, t0 = releases[c]
            left = max(30.0, args.deadline_s - (time.monotonic() - t_start) - 200)
            try:
                rc = proc.wait(timeout=left)
            except subprocess.TimeoutExpired:
                proc.kill()
                rc = "killed (timeout)"
            rec["release_s"] = round(time.monotonic() - t0, 1)
            rec["release_rc"] = rc
            rec["release_log_tail"] = log.read_text(errors="replace")[-1500:]
            print(f"release {c}: rc {rc}, {rec['release_s']} s", flush=True)
        bundle = None if args.no_bundle else _bundle_path(out)
        try:
            if bundle is None:
                raise RuntimeError("no bundle" if not args.no_bundle else "--no-bundle")
            t0 = time.monotonic()
            engine = dossier.load(bundle)
            rec["load_s"] = round(time.monotonic() - t0, 2)
            verdict = getattr(engine.report, "verdict", None)
            rec["dossier_loaded_via"] = (f"dossier.load({bundle.name}): verified "
                                         f"{getattr(verdict, 'value', verdict)}, shipped route "
                                         f"{engine.route}")
            engines[c] = _engine_call(engine)
        except Exception as exc:  # noqa: BLE001 - fall back to the backend's build and load
            rec["bundle_error"] = f"{type(exc).__name__}: {str(exc)[:400]}"
            try:
                from dossier.backends import get_backend
                from dossier.routes import Route

                backend = get_backend("torch-inductor")
                eng_path = args.work / f"{c}.pt2"
                t0 = time.monotonic()
                backend.build(args.specs_work / "specs" / c / "model.pt2", Route.parse(route),
                              eng_path)
                rec["fallback_build_s"] = round(time.monotonic() - t0, 1)
                runner = backend.load(eng_path, Route.parse(route))
                rec["dossier_loaded_via"] = f"backend.load (torch-inductor) with {route}"
                engines[c] = _engine_call(runner.run)
            except Exception as exc2:  # noqa: BLE001
                rec.setdefault("engines", {})[DOSSIER] = {
                    "error": f"build/load: {type(exc2).__name__}: {str(exc2)[:400]}"}
                print(traceback.format_exc(), flush=True)
        print(f"dossier engine {c}: {rec.get('dossier_loaded_via')}", flush=True)
    _write(args.out, doc)

    # per configuration: single inferences, then the searches
    for c in metas:
        rec = doc["configs"][c]
        feeds = _feeds(args.specs_work / "specs" / c)
        calls: dict[str, Callable[[dict], dict]] = {}
        if c in engines:
            calls[DOSSIER] = engines[c]
        if c in compiled:
            calls[COMPILE] = compiled[c][2]
        engs = rec.setdefault("engines", {})
        for name, call in calls.items():
            try:
                engs[name] = {"single": _single(call, feeds), "searches": []}
            except Exception as exc:  # noqa: BLE001, PERF203
                engs[name] = {"error": f"single: {type(exc).__name__}: {str(exc)[:400]}"}
                print(traceback.format_exc(), flush=True)
        if c in compiled:  # eager, for context: the same module, the same query path
            try:
                eager = _torch_call(compiled[c][0], compiled[c][1], args.device, False)
                rec["eager"] = _single(eager, feeds)
            except Exception as exc:  # noqa: BLE001
                rec["eager"] = {"error": f"{type(exc).__name__}: {str(exc)[:300]}"}
        print(f"{c}: single " + json.dumps({n: e.get("single", e.get("error"))
                                            for n, e in engs.items()}), flush=True)
        _write(args.out, doc)
        names = [n for n in (DOSSIER, COMPILE) if n in calls and "single" in engs.get(n, {})]
        for rep in range(args.reps):
            order = names if rep % 2 == 0 else list(reversed(names))
            for name in order:
                elapsed = time.monotonic() - t_start
                if elapsed > args.deadline_s:
                    engs[name]["searches"].append({"rep": rep, "skipped": f"deadline "
                                                   f"({elapsed:.0f} s elapsed)"})
                    continue
                print(f"{c} rep {rep}: {name}", flush=True)
                try:
                    s = _search([calls[name]], feeds, engs[name]["single"]["single_ms"],
                                BOUNDS[c], args.duration_s, args.min_queries, args.steps, rep,
                                args.work / "runs" / c / f"{name[:7].replace(' ', '_').replace('.', '_')}-rep{rep}")
                    engs[name]["searches"].append({"rep": rep, "order": order.index(name), **s})
                    print(f"{c} rep {rep}: {name}: {s['metric_qps']} QPS", flush=True)
                except Exception as exc:  # noqa: BLE001
                    engs[name]["searches"].append(
                        {"rep": rep, "error": f"{type(exc).__name__}: {str(exc)[:400]}"})
                    print(traceback.format_exc(), flush=True)
                summarize(doc)
                _write(args.out, doc)
    doc["finished"] = _now()
    doc["wall_s"] = round(time.monotonic() - t_start, 1)
    summarize(doc)
    _write(args.out, doc)
    if args.md:
        args.md.write_text(markdown(doc))
    if args.logs_tar:
        with tarfile.open(args.logs_tar, "w:gz") as tar:
            for path in sorted((args.work / "runs").rglob("mlperf_log_summary.txt")):
                tar.add(path, arcname=str(path.relative_to(args.work)))
            for path in sorted(args.work.glob("release-*.log")):
                tar.add(path, arcname=path.name)
    print(markdown(doc), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
