"""Orchestration cost per trial against the trial's own work (ONNX Runtime, CPU).

Runs the tuner on a sample with a small selection, several times, and splits each trial's wall
time into: startup (process start + imports, measured from the parent's spawn to the worker's
main), setup (backend + validation set), build, load, validate, time (the measurement itself),
report (writing the result) and the parent's share (request, wait, statistics, cache append).
Writes bench/results/orchestration.json with medians, 95% intervals (order statistics) and
sample counts.

    python bench/orchestration.py [--repeats 3] [--sample convnet]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import platform
import shutil
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from dossier.spec import load_spec  # noqa: E402
from dossier.timing import TimingSettings, median_ci  # noqa: E402
from dossier.tuner import tune  # noqa: E402


def _samples(out: Path) -> None:
    spec = importlib.util.spec_from_file_location("samples_build", ROOT / "samples" / "build.py")
    module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    sys.modules["samples_build"] = module
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    module.build_all(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--sample", default="convnet")
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "orchestration.json")
    args = ap.parse_args()
    phases: dict[str, list[float]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        tmp_path = Path(tmp)
        _samples(tmp_path / "samples")
        spec = load_spec(tmp_path / "samples" / args.sample / "release.toml",
                         {"strategy": "full",
                          "selection": "-intra_op_num_threads=[0|1|2] -enable_mem_pattern=[on|off]"})
        spec = spec.model_copy(update={"timing": TimingSettings(confirm_top=0)})
        for r in range(args.repeats):
            run = tmp_path / f"run{r}"
            res = tune(spec, run)
            for t in res.cache.trials:
                known = sum(t.phases_s.values())
                for k, v in {**t.phases_s, "parent": t.trial_s - known, "trial": t.trial_s}.items():
                    phases.setdefault(k, []).append(v)
            shutil.rmtree(run)
    summary = {}
    for k, v in phases.items():
        lo, hi = median_ci(v, 0.95)
        summary[k] = {"median_s": float(np.median(v)), "ci95_s": [lo, hi], "n": len(v)}
    work = sum(summary[k]["median_s"] for k in ("build", "load", "validate", "time") if k in summary)
    overhead = sum(summary[k]["median_s"] for k in ("startup", "setup", "report", "parent")
                   if k in summary)
    result = {"benchmark": "orchestration cost per trial", "sample": args.sample,
              "backend": "onnxruntime", "timing": "default TimingSettings (60 samples x 2 engines)",
              "host": {"machine": platform.machine(), "python": platform.python_version(),
                       "cpus": __import__("os").cpu_count()},
              "phases": summary, "own_work_median_s": work, "orchestration_median_s": overhead,
              "orchestration_share": overhead / (work + overhead)}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    for k, v in summary.items():
        print(f"{k:>9}: {v['median_s'] * 1e3:8.1f} ms  [{v['ci95_s'][0] * 1e3:.1f}, "
              f"{v['ci95_s'][1] * 1e3:.1f}]  n={v['n']}")
    print(f"orchestration {overhead * 1e3:.0f} ms vs own work {work * 1e3:.0f} ms per trial "
          f"({result['orchestration_share']:.0%} of the trial)")


if __name__ == "__main__":
    main()
