"""Calibration of the decision rule against a known truth: how often a real gain ships (power),
how often an A/A ships (false positives), how often a fresh re-measurement of a shipped gain
falls inside the prediction interval the release recorded (coverage), and what it costs.

The ground truth is the test-only ``faulty`` backend's load-time ``gain`` knob on the convnet
sample: with ``-pace=held`` every run is held to 2.0 ms (a busy-wait), and ``gain=x1.25`` /
``x1.05`` hold it to 2.0/1.25 and 2.0/1.05 ms, so the true speedup is known exactly; ``gain=aa``
holds it to 2.0 ms under another name (an A/A route). Every release is a fresh ``tune`` with the
default timing settings (the rule as committed: the commit is recorded), strategy ``full`` over
``-pace=held -gain=[none|G]``. For each shipped gain, up to ``--rebench`` of them, the engines
are re-measured with the procedure ``verify --rebench`` uses (``confirm_processes`` new
measuring processes) and the reading is checked against the recorded prediction interval.

    python bench/calibration.py --gain x1.25 --releases 20     # power under the host's load
    python bench/calibration.py --gain x1.05 --releases 10     # power for a small gain
    python bench/calibration.py --gain aa --releases 20        # false positives
    python bench/calibration.py --gain x1.25 --releases 1 --tiny   # smoke run (CI)

Writes bench/results/calibration-<gain>.json (``--out`` to change) after every release, so a
run cut short keeps what it measured: counts with exact (Clopper-Pearson) 95% intervals, each
release's decision, the load average before and after each release, and the wall times.
"""

from __future__ import annotations

import argparse
import datetime as dt
import importlib.util
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests" / "plugins"))  # the test-only faulty backend
import dossier_test_backends  # noqa: E402

dossier_test_backends.enable()  # registered here and in the trials' processes, never installed

from dossier.errors import DossierError  # noqa: E402
from dossier.jobs import measuring  # noqa: E402
from dossier.measure import confirmation  # noqa: E402
from dossier.measure.timing import TimingSettings, median_ci  # noqa: E402
from dossier.spec import load_spec  # noqa: E402
from dossier.tuner import tune  # noqa: E402

TRUTH = {"x1.25": 1.25, "x1.05": 1.05, "aa": 1.0}
TINY = {"samples": 40, "rounds": 8, "confirm_rounds": 4, "confirm_runs": 10,
        "confirm_block_s": 0.05, "confirm_processes": 3, "confirm_max_processes": 3,
        "warmup_max_s": 0.3}


def _build_samples(out: Path) -> None:
    spec = importlib.util.spec_from_file_location("samples_build", ROOT / "samples" / "build.py")
    module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    sys.modules["samples_build"] = module
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    module.build_all(out)


def _spec(folder: Path, gain: str, tiny: bool):  # type: ignore[no-untyped-def]
    text = (folder / "release.toml").read_text()
    text = text.replace('backend = "onnxruntime"', 'backend = "faulty"')
    lines = [f'selection = "-pace=held -gain=[none|{gain}]"' if ln.startswith("selection")
             else 'strategy = "full"' if ln.startswith("strategy") else ln
             for ln in text.splitlines()]
    (folder / "release.toml").write_text("\n".join(lines) + "\n")
    spec = load_spec(folder / "release.toml")
    if tiny:
        spec = spec.model_copy(update={"timing": spec.timing.model_copy(update=TINY)})
    return spec


def _share(hits: int, n: int) -> dict:
    """A proportion with its exact (Clopper-Pearson) 95% interval."""
    from scipy import stats

    if n == 0:
        return {"hits": 0, "n": 0}
    ci = stats.binomtest(hits, n).proportion_ci(0.95, method="exact")
    return {"hits": hits, "n": n, "share": hits / n, "ci": [ci.low, ci.high]}


def _median(values: list[float]) -> dict | None:
    if not values:
        return None
    lo, hi = median_ci(values, 0.95)
    return {"median": float(np.median(values)), "ci": [lo, hi], "n": len(values)}


def _release(spec, run: Path, rebench: bool) -> dict:  # type: ignore[no-untyped-def]
    load = os.getloadavg()[0]
    t0 = time.perf_counter()
    try:
        res = tune(spec, run)
    except DossierError as exc:  # a failed search is counted, not fatal to the benchmark
        return {"error": str(exc), "gain": False, "wall_s": time.perf_counter() - t0,
                "load_before": load, "load_after": os.getloadavg()[0]}
    d = res.decision
    trials = res.cache.trials
    confirms = [t for t in trials if t.role == "confirm" and t.route != d.baseline_route]
    rec: dict = {
        "gain": d.gain, "shipped": d.shipped_route, "reason": d.reason, "speedup": d.speedup,
        "ci": [d.speedup_ci_low, d.speedup_ci_high], "p_value": d.p_value, "level": d.level,
        "k": d.k, "processes": d.processes, "stopped": d.stopped,
        "confirm_aa": None if d.confirm_aa is None else d.confirm_aa.model_dump(mode="json"),
        "screened": [{"route": t.route, "speedup": t.comparison.speedup}
                     for t in trials if t.role == "search" and t.comparison is not None],
        "confirmation_s": max((t.trial_s for t in confirms), default=0.0),
        "wall_s": time.perf_counter() - t0, "load_before": load,
        "load_after": os.getloadavg()[0]}
    if d.gain and rebench:
        base = next(t for t in trials if t.role == "baseline")
        win = next(t for t in confirms if t.route == d.shipped_route)
        c = win.comparison
        assert c is not None and base.engine and win.engine
        timing = spec.timing
        with tempfile.TemporaryDirectory(prefix="dossier-rebench-") as work:
            measure = measuring.local_processes(
                res.cache.header.backend, Path(res.cache.header.validation_path), timing,
                builder=spec.builder, shapes=spec.shapes, work=Path(work))
            again = confirmation.confirm((run / base.engine, base.route),
                                         [(run / win.engine, win.route)], timing, measure,
                                         fixed=timing.confirm_processes)
        ac = again.candidates[0].comparison
        assert ac is not None
        rec["rebench"] = {"speedup": ac.speedup, "ci": [ac.speedup_ci_low, ac.speedup_ci_high],
                          "predicted": [c.prediction_low, c.prediction_high],
                          "processes": ac.processes,
                          "inside": bool(c.prediction_low <= ac.speedup <= c.prediction_high),  # type: ignore[operator]
                          "excludes_1": ac.speedup_ci_low > 1.0}
    return rec


def _summary(args: argparse.Namespace, runs: list[dict], started: str, done: bool) -> dict:
    truth = TRUTH[args.gain]
    ok = [r for r in runs if "error" not in r]
    shipped = [r for r in ok if r["gain"]]
    rebenched = [r["rebench"] for r in ok if "rebench" in r]
    return {
        "benchmark": "calibration of the decision rule (synthetic known gain)",
        "command": " ".join(["python", "bench/calibration.py", *sys.argv[1:]]),
        "commit": args.commit, "started": started, "done": done, "machine": {
            "cpus": os.cpu_count(), "processor": platform.processor() or platform.machine(),
            "python": platform.python_version()},
        "truth": {"gain": args.gain, "speedup": truth,
                  "selection": f"-pace=held -gain=[none|{args.gain}]", "backend": "faulty"},
        "timing": "tiny (smoke run)" if args.tiny else "default TimingSettings",
        "rule": confirmation.rule_text(TimingSettings()),
        "releases": len(runs), "errors": len(runs) - len(ok),
        "shipped": _share(len(shipped), len(ok)),
        "shipped_interval_covers_truth": _share(
            sum(r["ci"][0] <= truth <= r["ci"][1] for r in shipped), len(shipped)),
        "rebench_inside_prediction": _share(sum(r["inside"] for r in rebenched), len(rebenched)),
        "rebench_excludes_1": _share(sum(r["excludes_1"] for r in rebenched), len(rebenched)),
        "shipped_speedup": _median([r["speedup"] for r in shipped]),
        "processes": _median([float(r["processes"] or 0) for r in ok]),
        "confirmation_s": _median([r["confirmation_s"] for r in ok]),
        "release_wall_s": _median([r["wall_s"] for r in ok]),
        "load_before": _median([r["load_before"] for r in runs]),
        "runs": runs}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gain", choices=sorted(TRUTH), default="x1.25")
    ap.add_argument("--releases", type=int, default=10)
    ap.add_argument("--rebench", type=int, default=10,
                    help="re-measure at most this many shipped gains")
    ap.add_argument("--tiny", action="store_true", help="tiny timing: a smoke run, for CI")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    args.commit = subprocess.run(  # the code the runs are made with, read before the first
        ["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True,
        text=True, check=False).stdout.strip()
    out = args.out or ROOT / "bench" / "results" / f"calibration-{args.gain}.json"
    started = dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")
    runs: list[dict] = []
    with tempfile.TemporaryDirectory(prefix="dossier-calibration-") as tmp:
        samples = Path(tmp) / "samples"
        _build_samples(samples)
        for i in range(args.releases):
            folder = Path(tmp) / f"r{i}"
            shutil.copytree(samples / "convnet", folder)
            spec = _spec(folder, args.gain, args.tiny)
            rebench = sum("rebench" in r for r in runs) < args.rebench
            runs.append(_release(spec, folder / "out", rebench))
            shutil.rmtree(folder, ignore_errors=True)
            out.parent.mkdir(parents=True, exist_ok=True)
            tmp_out = out.with_suffix(".tmp")
            tmp_out.write_text(json.dumps(_summary(args, runs, started, False), indent=2) + "\n")
            os.replace(tmp_out, out)
    final = _summary(args, runs, started, True)
    out.write_text(json.dumps(final, indent=2) + "\n")
    print(json.dumps({k: final[k] for k in ("releases", "errors", "shipped",
                                            "rebench_inside_prediction", "release_wall_s")}))


if __name__ == "__main__":
    main()
