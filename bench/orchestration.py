"""Orchestration cost per trial against the trial's own work (ONNX Runtime, CPU).

Runs the tuner on the CPU samples (convnet and tblock) with a small selection, several times,
and splits each trial's wall time into: startup (process start + imports, measured from the
parent's spawn to the worker's main), setup (backend + validation set), build, load, validate,
time (the measurement itself), report (writing the result) and the parent's share (request,
wait, statistics, cache append). The overhead is everything of a trial but its build and its
timing (goal: at most 0.3 s a trial). Writes bench/results/orchestration.json with medians, 95%
intervals (order statistics) and sample counts, per sample and over both, with the command,
date and host.

    python bench/orchestration.py [--repeats 3] [--sample convnet --sample tblock]

``--smoke`` runs one small search of one sample (CI runs it: tests/project/test_bench_smoke.py).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import shutil
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.provenance import provenance  # noqa: E402
from dossier.measure.timing import TimingSettings, median_ci  # noqa: E402
from dossier.spec import load_spec  # noqa: E402
from dossier.tuner import tune  # noqa: E402

SELECTION = "-intra_op_num_threads=[0|1|2] -enable_mem_pattern=[on|off]"
"""Six routes of load-time knobs (every sample has them); the builds are the same graph."""
GOAL_S = 0.3
"""Per-trial overhead besides the build and the timing."""
OWN = ("build", "load", "validate", "time")
"""The trial's own work; the rest of its wall time is orchestration."""


def _samples(out: Path) -> None:
    spec = importlib.util.spec_from_file_location("samples_build", ROOT / "samples" / "build.py")
    module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    sys.modules["samples_build"] = module
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    module.build_all(out)


def _summary(values: list[float]) -> dict[str, object]:
    lo, hi = median_ci(values, 0.95)
    return {"median_s": float(np.median(values)), "ci95_s": [lo, hi], "n": len(values)}


def _phases(trials: list[object]) -> dict[str, list[float]]:
    phases: dict[str, list[float]] = {}
    for t in trials:
        known = sum(t.phases_s.values())  # type: ignore[attr-defined]
        got = {**t.phases_s, "parent": t.trial_s - known, "trial": t.trial_s,  # type: ignore[attr-defined]
               "overhead": t.trial_s - t.phases_s.get("build", 0.0)  # type: ignore[attr-defined]
               - t.phases_s.get("time", 0.0)}  # type: ignore[attr-defined]
        for k, v in got.items():
            phases.setdefault(k, []).append(v)
    return phases


def _report(phases: dict[str, list[float]]) -> dict[str, object]:
    summary = {k: _summary(v) for k, v in phases.items()}
    work = sum(summary[k]["median_s"] for k in OWN if k in summary)  # type: ignore[misc]
    overhead = sum(summary[k]["median_s"] for k in ("startup", "setup", "report", "parent")  # type: ignore[misc]
                   if k in summary)
    return {"phases": summary, "own_work_median_s": work, "orchestration_median_s": overhead,
            "orchestration_share": overhead / (work + overhead),
            "overhead_besides_build_and_time": summary["overhead"],
            "goal": f"overhead besides build and timing <= {GOAL_S} s a trial",
            "goal_met": summary["overhead"]["median_s"] <= GOAL_S}  # type: ignore[operator]


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--sample", action="append", choices=("convnet", "tblock"))
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "orchestration.json")
    ap.add_argument("--smoke", action="store_true",
                    help="one search of the convnet sample over two routes, small timing")
    args = ap.parse_args()
    made = provenance()
    samples = args.sample or (["convnet"] if args.smoke else ["convnet", "tblock"])
    selection = "-intra_op_num_threads=[0|1]" if args.smoke else SELECTION
    timing = (TimingSettings(samples=10, rounds=6, warmup_window=2, warmup_min_runs=1,
                             warmup_max_s=0.2, confirm_top=0)
              if args.smoke else TimingSettings(confirm_top=0))
    repeats = 1 if args.smoke else args.repeats
    per_sample: dict[str, dict[str, list[float]]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        tmp_path = Path(tmp)
        _samples(tmp_path / "samples")
        for name in samples:
            spec = load_spec(tmp_path / "samples" / name / "release.toml",
                             {"strategy": "full", "selection": selection})
            spec = spec.model_copy(update={"timing": timing})
            for r in range(repeats):
                run = tmp_path / f"{name}-run{r}"
                res = tune(spec, run)
                for k, v in _phases(list(res.cache.trials)).items():
                    per_sample.setdefault(name, {}).setdefault(k, []).extend(v)
                shutil.rmtree(run)
    both: dict[str, list[float]] = {}
    for phases in per_sample.values():
        for k, v in phases.items():
            both.setdefault(k, []).extend(v)
    result = {"benchmark": "orchestration cost per trial", "provenance": made,
              "smoke": args.smoke, "samples": samples, "backend": "onnxruntime",
              "selection": selection, "strategy": "full", "repeats": repeats,
              "timing": "small (smoke)" if args.smoke
              else "default TimingSettings, no confirmation round",
              **_report(both),
              "per_sample": {name: _report(phases) for name, phases in per_sample.items()}}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    for k, v in result["phases"].items():  # type: ignore[attr-defined]
        print(f"{k:>9}: {v['median_s'] * 1e3:8.1f} ms  [{v['ci95_s'][0] * 1e3:.1f}, "
              f"{v['ci95_s'][1] * 1e3:.1f}]  n={v['n']}")
    o = result["overhead_besides_build_and_time"]
    print(f"overhead besides build and timing {o['median_s'] * 1e3:.0f} ms "  # type: ignore[index]
          f"[{o['ci95_s'][0] * 1e3:.0f}, {o['ci95_s'][1] * 1e3:.0f}] n={o['n']} per trial "  # type: ignore[index]
          f"(goal {GOAL_S * 1e3:.0f} ms); orchestration {result['orchestration_median_s'] * 1e3:.0f}"  # type: ignore[operator]
          f" ms vs own work {result['own_work_median_s'] * 1e3:.0f} ms")  # type: ignore[operator]


if __name__ == "__main__":
    main()
