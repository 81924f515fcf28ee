"""The search's trial processes started on standby (``trial_prestart``) against processes
started at their turns, on this host.

The same search (the torch-mlp sample, AOTInductor on the CPU, six routes, ``full``; every
engine from a build cache filled by one search first, so no trial builds) runs ``--repeats``
times each way, in alternating order, the confirmation the same both ways (its processes
started at their turns). Per search: its wall time and the sum of its trials' walls; per trial
after the first: its phases (startup, setup, and with prestart the standby and the wait).
Writes ``bench/results/trial-prestart-cpu.json``: medians with 95% intervals (order
statistics) and sample counts, the difference of the medians, the command, date and host.

    python bench/trial_prestart.py [--repeats 5] [--out bench/results/trial-prestart-cpu.json]

``--smoke``: one search each way over two routes (``tests/project/test_bench_smoke.py``, slow: it
builds two AOTInductor packages).

On a CPU a trial's loads and validation take milliseconds, so a standby hides little of the
next trial's interpreter start and torch import: the saving expected is about one import a
search (the first trial's, hidden behind the build-cache lookups), not one a trial.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.provenance import provenance  # noqa: E402
from dossier.measure.timing import TimingSettings, median_ci  # noqa: E402
from dossier.spec import load_spec  # noqa: E402
from dossier.tuner import tune  # noqa: E402

SELECTION = "-device=cpu -inductor:freezing=[false|true] -inductor:cpp.threads=[-1|1|2]"
"""Six routes, each its own build (so its own engine from the build cache)."""
SMOKE_SELECTION = "-device=cpu -inductor:freezing=[false|true]"
TIMING = TimingSettings(samples=12, rounds=6, block_warmup=1, warmup_window=2, warmup_min_runs=1,
                        warmup_max_s=0.2, confirm_top=1, confirm_rounds=3, confirm_warmup=2,
                        confirm_runs=5, confirm_block_s=0.05, confirm_processes=3,
                        confirm_max_processes=3, confirm_prestart=False)
"""Small timing (the decisions mean nothing here; the processes are the real ones)."""


def _summary(values: list[float]) -> dict[str, Any]:
    lo, hi = median_ci(values, 0.95)
    return {"median_s": round(float(np.median(values)), 3), "ci95_s": [round(lo, 3), round(hi, 3)],
            "n": len(values)}


def _search(spec: Any, run: Path, cache: Path, prestart: bool | None) -> dict[str, Any]:
    timing = TIMING.model_copy(update={"trial_prestart": prestart})
    res = tune(spec.model_copy(update={"timing": timing}), run, build_cache=cache)
    trials = [t for t in res.cache.trials if t.role != "confirm"]
    return {"search_wall_s": sum(s.wall_s for s in res.cache.sessions),
            "trials_s": sum(t.trial_s for t in trials), "trials": len(trials),
            "phases": [dict(t.phases_s) for t in trials[1:]],
            "built": sum(1 for t in trials if t.extra.get("build_cache") != "hit")}


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--smoke", action="store_true", help="one search each way, two routes")
    ap.add_argument("--out", type=Path,
                    default=ROOT / "bench" / "results" / "trial-prestart-cpu.json")
    args = ap.parse_args()
    from samples import torch_models

    made = provenance()
    selection, repeats = (SMOKE_SELECTION, 1) if args.smoke else (SELECTION, args.repeats)
    runs: dict[str, list[dict[str, Any]]] = {"on": [], "off": []}
    with tempfile.TemporaryDirectory() as tmp:
        tmp_path = Path(tmp)
        spec = load_spec(torch_models.build_torch_mlp(tmp_path / "samples"),
                         {"strategy": "full", "selection": selection})
        cache = tmp_path / "build-cache"
        _search(spec, tmp_path / "fill", cache, False)  # fills the build cache; not counted
        for r in range(repeats):
            for way in (("on", "off") if r % 2 == 0 else ("off", "on")):
                runs[way].append(_search(spec, tmp_path / f"{way}-{r}", cache, way == "on"))
    result: dict[str, Any] = {
        "benchmark": "trial processes started on standby against at their turns",
        "provenance": made, "backend": "torch-inductor (cpu)", "sample": "torch-mlp",
        "smoke": args.smoke, "selection": selection, "strategy": "full", "repeats": repeats,
        "timing": "small (the decisions mean nothing); confirmation processes at their turns",
        "engines_built_in_counted_searches": sum(x["built"] for v in runs.values() for x in v),
    }
    for way, xs in runs.items():
        phases: dict[str, list[float]] = {}
        for x in xs:
            for p in x["phases"]:
                for k, v in p.items():
                    phases.setdefault(k, []).append(v)
        result[way] = {"search_wall": _summary([x["search_wall_s"] for x in xs]),
                       "trials_sum": _summary([x["trials_s"] for x in xs]),
                       "trials_per_search": xs[0]["trials"] if xs else 0,
                       "phases_after_the_first_trial": {k: _summary(v)
                                                        for k, v in sorted(phases.items())}}
    result["search_wall_median_saved_s"] = round(
        result["off"]["search_wall"]["median_s"] - result["on"]["search_wall"]["median_s"], 3)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    for way in ("off", "on"):
        w = result[way]["search_wall"]
        print(f"prestart {way:>3}: search {w['median_s']:.2f} s [{w['ci95_s'][0]:.2f}, "
              f"{w['ci95_s'][1]:.2f}] n={w['n']}")
    print(f"saved at the median: {result['search_wall_median_saved_s']:.2f} s a search")


if __name__ == "__main__":
    main()
