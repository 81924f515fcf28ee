"""Calibration of the decision rule on the samples: how often a gain ships, whether shipped
gains hold up when re-measured independently, and how often an A/A search ships anything.

Three parts, each run repeatedly with the default timing settings:

- ``aa``: A/A searches on convnet (a selection whose two values build the same engine and run
  the same way, as bench/aa_check.py): any shipped gain is a false positive.
- ``release``: the sample's own release spec (``--sample``, tblock by default), tuned from
  scratch each time: (a) how often a gain ships; for every shipped gain, the shipped and the
  baseline engines are re-measured with the independent procedure (dossier.replicate, as
  ``verify --rebench`` does): (b) coverage, how often the re-measured speedup falls inside the
  recorded 95% interval, and how often the re-measured interval excludes 1.0. The best
  candidate of the confirmation is re-measured too when nothing ships (``candidate_coverage``:
  the confirmation interval's coverage whether or not the rule shipped it).

``--selection`` replaces the release spec's selection (e.g. one knob with a real difference,
so that gains ship and their coverage can be counted) and ``--confirm-processes N`` runs every
confirmation and re-measurement in N process generations (``timing.confirm_processes``), whose
interval also covers a new generation's reading.

Writes bench/results/calibration-<sample>.json (``--out`` to change) with the counts, the figures (medians with
intervals), every run's details and the machine load (os.getloadavg before and after, CPU
count). Full counts (20 A/A, 10 releases) by one command:

    python bench/calibration.py            # --aa 20 --releases 10 --sample tblock
    python bench/calibration.py --aa 5 --releases 3   # reduced counts
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from dossier import replicate  # noqa: E402
from dossier.errors import DossierError  # noqa: E402
from dossier.spec import load_spec  # noqa: E402
from dossier.timing import compare, median_ci  # noqa: E402
from dossier.tuner import tune  # noqa: E402

AA_SELECTION = "-execution_mode=sequential -inter_op_num_threads=[0|1]"


def _build_samples(out: Path) -> None:
    spec = importlib.util.spec_from_file_location("samples_build", ROOT / "samples" / "build.py")
    module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    sys.modules["samples_build"] = module
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    module.build_all(out)


def _reading(r: object) -> dict | None:
    return None if r is None else r.model_dump(mode="json")  # type: ignore[attr-defined]


def _one_search(spec, run: Path) -> dict:  # type: ignore[no-untyped-def]
    t0 = time.perf_counter()
    try:
        return _search(spec, run, t0)
    except DossierError as exc:  # a failed search is counted, not fatal to the benchmark
        return {"error": str(exc), "gain": False, "aa": None, "reason": f"error: {exc}",
                "wall_s": time.perf_counter() - t0, "loadavg": os.getloadavg()[0]}


def _search(spec, run: Path, t0: float) -> dict:  # type: ignore[no-untyped-def]
    res = tune(spec, run)
    d = res.decision
    rec = {"gain": d.gain, "shipped": d.shipped_route, "reason": d.reason,
           "speedup": d.speedup, "ci": [d.speedup_ci_low, d.speedup_ci_high],
           "p_value": d.p_value, "aa": _reading(d.aa), "confirm_aa": _reading(d.confirm_aa),
           "confirmed_routes": d.candidates, "wall_s": time.perf_counter() - t0,
           "loadavg": os.getloadavg()[0]}
    base = next(t for t in res.cache.trials if t.role == "baseline")
    confirmed = [t for t in res.cache.trials if t.role == "confirm" and t.route != base.route
                 and t.comparison is not None]
    # the shipped route, else the best independently measured candidate: its recorded
    # (confirmation) interval against a second independent re-measurement
    target = (next(t for t in confirmed if t.route == d.shipped_route) if d.gain and confirmed
              else max(confirmed, key=lambda t: t.comparison.speedup) if confirmed else None)  # type: ignore[union-attr]
    if target is not None:
        rc = target.comparison
        m = replicate.measure(res.cache.header.backend,
                              [(run / base.engine, base.route), (run / target.engine, target.route)],  # type: ignore[operator]
                              Path(res.cache.header.validation_path), spec.timing)
        c = compare(m.rounds[0], m.rounds[1], spec.timing, procedure="independent")
        rec["remeasured"] = {"route": target.route, "shipped": d.gain,
                             "recorded": [rc.speedup, rc.speedup_ci_low, rc.speedup_ci_high],  # type: ignore[union-attr]
                             "speedup": c.speedup, "ci": [c.speedup_ci_low, c.speedup_ci_high],
                             "p_value": c.p_value, "rounds": c.rounds}
        rec["covered"] = rc.speedup_ci_low <= c.speedup <= rc.speedup_ci_high  # type: ignore[union-attr]
        rec["remeasured_excludes_1"] = c.speedup_ci_low > 1.0
        rec["intervals_overlap"] = not (c.speedup_ci_high < rc.speedup_ci_low  # type: ignore[union-attr]
                                        or c.speedup_ci_low > rc.speedup_ci_high)  # type: ignore[union-attr]
    return rec


def _share(hits: int, n: int) -> dict:
    """A proportion with its exact (Clopper-Pearson) 95% interval."""
    from scipy import stats

    if n == 0:
        return {"hits": 0, "n": 0}
    ci = stats.binomtest(hits, n).proportion_ci(0.95, method="exact")
    return {"hits": hits, "n": n, "share": hits / n, "ci": [ci.low, ci.high]}


def _write(path: Path, result: dict) -> None:
    """Written after every search, so a run cut short leaves what it measured."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(result, indent=2) + "\n")
    os.replace(tmp, path)


def _median(values: list[float]) -> dict | None:
    if not values:
        return None
    lo, hi = median_ci(values, 0.95)
    return {"median": float(np.median(values)), "ci": [lo, hi], "n": len(values)}


def _result(args: argparse.Namespace, aa_runs: list[dict], rel_runs: list[dict],
            load_before: tuple[float, float, float], started: str, done: bool) -> dict:
    shipped = [r for r in rel_runs if r["gain"]]
    measured = [r for r in rel_runs if "remeasured" in r]  # shipped or best confirmed candidate
    gains = [r for r in measured if r["gain"]]
    return {
        "benchmark": "calibration of the decision rule", "backend": "onnxruntime",
        "sample": args.sample, "aa_selection": AA_SELECTION, "timing": "default TimingSettings",
        "selection": args.selection, "confirm_processes": args.confirm_processes or 1,
        "complete": done, "errors": sum("error" in r for r in aa_runs + rel_runs),
        "counts": {"aa_searches": len(aa_runs), "release_searches": len(rel_runs),
                   "asked": {"aa": args.aa, "releases": args.releases}},
        "host": {"machine": platform.machine(), "cpus": os.cpu_count(), "started": started,
                 "finished": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                 "loadavg_before": load_before, "loadavg_after": os.getloadavg(),
                 "loadavg_during_median": float(np.median([r["loadavg"] for r in
                                                           aa_runs + rel_runs] or [0]))},
        "aa_false_positives": _share(sum(r["gain"] for r in aa_runs), len(aa_runs)),
        "aa_trial0_significant": _share(sum(bool(r["aa"] and r["aa"]["significant"])
                                            for r in aa_runs + rel_runs),
                                        len(aa_runs) + len(rel_runs)),
        "gain_shipped": _share(len(shipped), len(rel_runs)),
        "coverage": _share(sum(r["covered"] for r in gains), len(gains)),
        "remeasured_excludes_1": _share(sum(r["remeasured_excludes_1"] for r in gains), len(gains)),
        "intervals_overlap": _share(sum(r["intervals_overlap"] for r in gains), len(gains)),
        "shipped_speedup": _median([r["speedup"] for r in gains]),
        "remeasured_speedup": _median([r["remeasured"]["speedup"] for r in gains]),
        "candidate_coverage": _share(sum(r["covered"] for r in measured), len(measured)),
        "candidate_intervals_overlap": _share(sum(r["intervals_overlap"] for r in measured),
                                              len(measured)),
        "aa_reading": _median([r["aa"]["speedup"] for r in aa_runs + rel_runs if r["aa"]]),
        "search_wall_s": _median([r["wall_s"] for r in rel_runs]),
        "aa_details": aa_runs, "release_details": rel_runs}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--aa", type=int, default=20, help="A/A searches on convnet (0: none)")
    ap.add_argument("--releases", type=int, default=10, help="release searches of --sample")
    ap.add_argument("--sample", default="tblock")
    ap.add_argument("--selection", help="replaces the release spec's selection")
    ap.add_argument("--confirm-processes", type=int, default=None,
                    help="timing.confirm_processes of every search")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    out = args.out or ROOT / "bench" / "results" / f"calibration-{args.sample}.json"
    load_before = os.getloadavg()
    started = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    aa_runs, rel_runs = [], []
    with tempfile.TemporaryDirectory() as tmp:
        _build_samples(Path(tmp) / "samples")
        aa_spec = load_spec(Path(tmp) / "samples" / "convnet" / "release.toml",
                            {"strategy": "full", "selection": AA_SELECTION})
        rel_spec = load_spec(Path(tmp) / "samples" / args.sample / "release.toml",
                             {"selection": args.selection} if args.selection else None)
        if args.confirm_processes:
            aa_spec, rel_spec = (s.model_copy(update={"timing": s.timing.model_copy(
                update={"confirm_processes": args.confirm_processes})})
                for s in (aa_spec, rel_spec))
        # interleaved, so a change of the machine's load touches both parts alike
        for i in range(max(args.aa, args.releases)):
            if i < args.aa:
                aa_runs.append(_one_search(aa_spec, Path(tmp) / f"aa{i}"))
                r = aa_runs[-1]
                print(f"[aa {i}] {'GAIN ' + str(r['speedup']) if r['gain'] else 'no gain'}; "
                      f"{r['reason'][:150]}", flush=True)
            if i < args.releases:
                rel_runs.append(_one_search(rel_spec, Path(tmp) / f"rel{i}"))
                r = rel_runs[-1]
                extra = (f" re-measured {r['remeasured']['speedup']:.3f} "
                         f"{'inside' if r['covered'] else 'OUTSIDE'}" if "remeasured" in r else "")
                print(f"[release {i}] {r['reason'][:150]}{extra}", flush=True)
            _write(out, _result(args, aa_runs, rel_runs, load_before, started, False))
    result = _result(args, aa_runs, rel_runs, load_before, started, True)
    _write(out, result)
    fp, g, cov = result["aa_false_positives"], result["gain_shipped"], result["coverage"]
    print(f"A/A: {fp['hits']} of {fp['n']} shipped a gain; {args.sample}: a gain shipped in "
          f"{g['hits']} of {g['n']}; coverage {cov['hits']} of {cov['n']}; written {out}")


if __name__ == "__main__":
    main()
