"""Time to first inference after ``dossier.load`` in fresh processes, on this (CPU) host.

Two bundles tuned here, so that this host's verdict is VALID and its own fingerprint is
collected (no ``host=``): the ONNX Runtime convnet sample and an AOTInductor CPU build of the
torch-mlp sample (small timing: the decisions mean nothing, the load path is the real one)::

    python bench/first_inference.py make --out /tmp/ttfi
    mkdir /tmp/ttfi-before && git archive 0949817 | tar -x -C /tmp/ttfi-before
    python bench/first_inference.py measure /tmp/ttfi/convnet-1.dossier \\
        /tmp/ttfi/torch-mlp-1.dossier --processes 7 --code before=/tmp/ttfi-before \\
        --code after=. --json bench/results/first-inference-cpu.json

(0949817: the commit before the fingerprint was collected in the background.)

Each process is started fresh (``python bench/first_inference.py first BUNDLE``) and times, as
``bench/h200/steps.py``'s ``step_first`` does, ``dossier.load(bundle)`` and the first call on
the first validation pair's inputs (``time_to_first_inference_s``); ``process_s`` is the wall
time from the parent's spawn to the end of that first call (interpreter start and ``import
dossier`` included). The processes alternate checkouts and bundles, so that each sees the same
load; every row goes to the JSON file (``--json``) with the load average at its start.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]


def make(out: Path) -> None:
    """Build, tune (small timing) and bundle both samples under ``out``."""
    sys.path.insert(0, str(REPO))
    import importlib.util

    from dossier.bundle import write_bundle
    from dossier.measure.timing import TimingSettings
    from dossier.spec import load_spec
    from dossier.tuner import tune

    spec = importlib.util.spec_from_file_location("samples_build", REPO / "samples" / "build.py")
    assert spec and spec.loader
    build = importlib.util.module_from_spec(spec)
    sys.modules["samples_build"] = build
    spec.loader.exec_module(build)
    from samples import torch_models

    timing = TimingSettings(samples=12, rounds=6, block_warmup=1, warmup_window=2,
                            warmup_min_runs=1, warmup_max_s=0.2, confirm_top=1,
                            trial_timeout_s=300, confirm_rounds=3, confirm_warmup=2,
                            confirm_runs=5, confirm_block_s=0.05, confirm_processes=3,
                            confirm_max_processes=3)
    convnet = next(s for s in build.SAMPLES if s.name == "convnet")
    specs = {
        "convnet": (build.build_sample(convnet, out / "samples"),
                    {"selection": "-graph_optimization_level=[all|disable_all]"}),
        "torch-mlp": (torch_models.build_torch_mlp(out / "samples"), {"selection": "-device=cpu"}),
    }
    for name, (path, override) in specs.items():
        release = load_spec(path, override).model_copy(update={"timing": timing})
        tune(release, out / "runs" / name, spec_path=path)
        print(write_bundle(out / "runs" / name, out).path)


def first(bundle: Path, *, import_torch: bool = False) -> dict[str, Any]:
    """In this fresh process: import dossier, then (``import_torch``) torch on its own, timed
    apart (a serving process of a torch engine imports it anyway), then ``dossier.load(bundle)``
    and the first call on the first validation pair's host arrays (numpy out, so the call ends
    synchronized; with a CUDA-graph route, the capture), then a second. Also the H200 bench's
    ``first`` step."""
    t0 = time.perf_counter()
    import numpy as np

    import dossier
    from dossier.validation import load_validation_set

    imported = time.perf_counter() - t0
    torch_s = None
    if import_torch:
        t = time.perf_counter()
        import torch  # noqa: F401

        torch_s = round(time.perf_counter() - t, 3)
    pair = load_validation_set(bundle / "validation").pairs[0]
    t1 = time.perf_counter()
    engine = dossier.load(bundle)
    t2 = time.perf_counter()
    out = engine(pair.inputs)
    t3 = time.perf_counter()
    done = time.time()
    engine(pair.inputs)
    t4 = time.perf_counter()
    err = max(float(np.max(np.abs(out[n].astype(np.float64) - pair.references[n])))
              for n in pair.references)
    return {"bundle": bundle.name, "backend": engine.backend, "route": engine.route,
            "verdict": engine.report.verdict.value if engine.report.verdict else None,
            "import_s": round(imported, 3), "import_torch_s": torch_s,
            "load_s": round(t2 - t1, 3), "first_call_s": round(t3 - t2, 3),
            "time_to_first_inference_s": round(t3 - t1, 3),
            "second_call_ms": round((t4 - t3) * 1e3, 3), "done": done, "max_abs_error": err,
            "torch_imported": "torch" in sys.modules}


def measure(bundles: list[Path], processes: int, codes: dict[str, Path]) -> dict[str, Any]:
    """``processes`` fresh processes per bundle and per checkout of dossier (``codes``: label
    to folder), alternating checkouts and bundles so that both see the same load; medians."""
    rows: list[dict[str, Any]] = []
    for i in range(processes):
        for bundle in bundles:
            for label, code in codes.items():
                env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(code),
                                                                    str(code / ".shim")])}
                load = os.getloadavg()[0]
                start = time.time()
                proc = subprocess.run([sys.executable, str(Path(__file__).resolve()),  # noqa: S603
                                       "first", str(bundle)], capture_output=True, text=True,
                                      timeout=600, check=False, env=env)
                if proc.returncode != 0:
                    raise SystemExit(f"{label} {bundle}: {proc.stderr[-2000:]}")
                row = json.loads(proc.stdout.splitlines()[-1])
                row.update(label=label, process=i, load_average_1m=round(load, 2),
                           process_s=round(row.pop("done") - start, 3))
                rows.append(row)
                print(json.dumps(row), flush=True)
    median: dict[str, dict[str, dict[str, float]]] = {}
    for label in codes:
        for bundle in bundles:
            mine = [r for r in rows if r["bundle"] == bundle.name and r["label"] == label]
            median.setdefault(label, {})[bundle.name] = {
                key: statistics.median(r[key] for r in mine)
                for key in ("time_to_first_inference_s", "load_s", "first_call_s", "process_s",
                            "load_average_1m")}
    return {"codes": {k: str(v) for k, v in codes.items()}, "processes": processes,
            "cpus": os.cpu_count(), "python": sys.version.split()[0],
            "started_load_average": rows[0]["load_average_1m"], "median": median, "rows": rows}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("make")
    p.add_argument("--out", type=Path, required=True)
    p = sub.add_parser("first")
    p.add_argument("bundle", type=Path)
    p = sub.add_parser("measure")
    p.add_argument("bundles", type=Path, nargs="+")
    p.add_argument("--processes", type=int, default=7)
    p.add_argument("--code", action="append", default=[], metavar="LABEL=DIR",
                   help="a checkout of dossier to run, by label (default: this one, 'here')")
    p.add_argument("--json", type=Path, help="write the result to this JSON file")
    args = parser.parse_args()
    if args.command == "make":
        make(args.out)
    elif args.command == "first":
        print(json.dumps(first(args.bundle)))
    else:
        codes = {label: Path(folder).resolve() for label, _, folder in
                 (c.partition("=") for c in args.code)} or {"here": REPO}
        result = measure(args.bundles, args.processes, codes)
        print(json.dumps(result["median"], indent=2))
        if args.json is not None:
            args.json.write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
