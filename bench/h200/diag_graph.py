"""The torch-inductor backend's GPU path in one command: how packages link libstdc++ here, a
ResNet-50 b1 bf16 package built by the backend, loaded in a fresh process (load time, no CPU
probe), and the AOTInductor default against the same package replayed in a CUDA graph (accuracy
and dossier's interleaved timing), then optionally a ``dossier tune`` over ``-cuda_graph``.

    python3 bench/h200/diag_graph.py --out DIR [--config resnet50_b1] [--tune]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench" / "h200"))
from dossier.run_folder import CACHE_NAME  # noqa: E402

ROUTE = "-device=cuda -dtype=bfloat16"


def measure(folder: Path, engine: Path) -> dict:
    """In a fresh process: load times, accuracy of both runners, interleaved timing."""
    t0 = time.perf_counter()
    import numpy as np
    import torch

    rec: dict = {"import_torch_s": round(time.perf_counter() - t0, 2)}
    t0 = time.perf_counter()
    torch.cuda.init()
    rec["cuda_init_s"] = round(time.perf_counter() - t0, 2)
    from dossier.backends import get_backend
    from dossier.measure.timing import compare, flatten, sample_rounds, summarize, warm_up
    from dossier.routes import Route
    from dossier.spec import load_spec
    from dossier.validation import judge, load_validation_set

    spec = load_spec(folder / "release.toml")
    vset = load_validation_set(folder / "validation")
    backend = get_backend("torch-inductor")
    runners = {}
    for label, route in (("default", ROUTE), ("cuda_graph", ROUTE + " -cuda_graph=on")):
        t0 = time.perf_counter()
        runners[label] = backend.load(engine, Route.parse(route))
        rec[f"load_{label}_s"] = round(time.perf_counter() - t0, 3)
    outs = {}
    for label, r in runners.items():
        t0 = time.perf_counter()
        outs[label] = {p.name: r.run(p.inputs) for p in vset.pairs}
        rec[f"first_run_{label}_s"] = round(time.perf_counter() - t0, 3)
        acc = judge(outs[label], vset, spec.tune.metric, spec.tune.threshold)
        rec[f"worst_loss_{label}"] = acc.worst
        rec[f"admissible_{label}"] = bool(acc)
    rec["graphs_captured"] = runners["cuda_graph"].graphs  # type: ignore[attr-defined]
    rec["max_abs_diff_graph_vs_default"] = max(
        float(np.max(np.abs(outs["default"][p][k] - outs["cuda_graph"][p][k])))
        for p in outs["default"] for k in outs["default"][p])
    fns = []
    for r in runners.values():
        prepared = [r.prepare(p.inputs) for p in vset.pairs]
        fns.append(lambda _i, r=r, prepared=prepared: sum(r.timed(x) for x in prepared))
    timing = spec.timing
    warm = [warm_up(f, timing, 1) for f in fns]
    rounds = sample_rounds([lambda f=f: f for f in fns], timing, 1)  # both loaded throughout
    for label, per_round, w in zip(runners, rounds, warm):
        rec[f"timing_{label}"] = summarize(flatten(per_round)[0], timing.confidence,
                                           w).model_dump()
    c = compare(rounds[0], rounds[1], timing, baseline_warmup=warm[0])
    rec["speedup_graph_over_default"] = c.speedup
    rec["speedup_ci"] = [c.speedup_ci_low, c.speedup_ci_high]
    rec["significant"] = c.significant
    rec["pass_ms_note"] = "one sample = one pass over the validation pairs' inputs"
    return rec


def tune_graph(folder: Path, run_dir: Path, out: Path) -> dict:
    """``dossier tune`` over ``-cuda_graph=[off|on]`` (one build: the graph route reuses it)."""
    import shutil

    import make_specs
    from steps import run_summary

    spec = folder / "release-graph.toml"
    spec.write_text(make_specs.spec_text("bench-graph", "cuda_graph on/off",
                                         ROUTE + " -cuda_graph=[off|on]", make_specs.TIMING,
                                         1e-3))
    shutil.rmtree(run_dir, ignore_errors=True)
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "dossier_cli.main", "tune", str(spec), "--strategy",  # noqa: S603
                           "fast", "--out", str(run_dir), "--json", "--quiet"], cwd=REPO,
                          capture_output=True, text=True, timeout=400, check=False)
    rec: dict = {"rc": proc.returncode, "wall_s": round(time.perf_counter() - t0, 2),
                 "stderr_tail": proc.stderr[-2000:]}
    if (run_dir / CACHE_NAME).is_file():
        rec.update(run_summary(run_dir))
        rec.pop("knob_database", None)
        shutil.copy(run_dir / CACHE_NAME, out / f"diag-graph-{CACHE_NAME}")
    return rec


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--config", default="resnet50_b1")
    ap.add_argument("--work", type=Path, default=REPO / "bench" / "work" / "h200")
    ap.add_argument("--tune", action="store_true")
    ap.add_argument("--measure", type=Path, help="(internal) engine to measure in this process")
    args = ap.parse_args()
    folder = args.work / "specs" / args.config
    if args.measure:
        print(json.dumps(measure(folder, args.measure)))
        return 0
    rec: dict = {"config": args.config, "route": ROUTE}
    out = args.out / f"diag-graph-{args.config}.json"

    def save() -> None:
        args.out.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(rec, indent=1, default=str))

    from dossier import cxx_runtime

    first = cxx_runtime.first_compiler()
    rec["first_compiler"] = vars(cxx_runtime.probe(first)) if first else None
    plan = cxx_runtime.choose()
    rec["cxx_plan"] = {"compiler": vars(plan.compiler) if plan.compiler else None,
                       "override": plan.override, "preload": plan.preload}
    rec["system_libstdcxx"] = cxx_runtime.system_libstdcxx()
    save()
    import make_specs

    t0 = time.perf_counter()
    factory, batch = make_specs.CONFIGS[args.config]
    rec["specs"] = make_specs.write_config(args.work, args.config, factory, batch, device="cuda",
                                           ref_device="cuda", dtype="bfloat16", pairs=2,
                                           tiny=False, force=False)
    rec["specs_s"] = round(time.perf_counter() - t0, 2)
    save()
    from dossier.backends import get_backend
    from dossier.routes import Route

    engine = args.work / "diag" / f"{args.config}.pt2"
    t0 = time.perf_counter()
    info = get_backend("torch-inductor").build(folder / "model.pt2", Route.parse(ROUTE), engine)
    rec["build_s"] = round(time.perf_counter() - t0, 2)
    rec["build_facts"] = info.facts
    save()
    t0 = time.perf_counter()
    env = {**os.environ, **cxx_runtime.loader_env(engine), "PYTHONFAULTHANDLER": "1"}
    proc = subprocess.run([sys.executable, __file__, "--measure", str(engine), "--config",  # noqa: S603
                           args.config, "--out", str(args.out), "--work", str(args.work)],
                          capture_output=True, text=True, env=env, timeout=300, check=False)
    rec["fresh_process_wall_s"] = round(time.perf_counter() - t0, 2)
    rec["fresh_rc"] = proc.returncode
    try:
        rec["fresh"] = json.loads(proc.stdout.strip().splitlines()[-1])
    except (IndexError, json.JSONDecodeError):
        rec["fresh_stderr"] = proc.stderr[-3000:]
    save()
    if args.tune:
        rec["tune"] = tune_graph(folder, args.work / "diag" / "run-graph", args.out)
        save()
    print(json.dumps(rec, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
