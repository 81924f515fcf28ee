"""Bundle verification speed (xxh3-128 against sha256sum) and the writer's peak memory.

1. Tunes the convnet sample with a 2-route selection and small timing, then swaps the shipped
   engine for a file of random bytes (default 1 GiB) and records its digest in the tuning cache.
2. Bundles that run, then times, alternating and repeated, (a) ``check_integrity`` of the whole
   bundle in this process (what ``dossier verify --integrity-only`` does: every file, streamed
   xxh3-128), (b) the whole command ``dossier verify BUNDLE --integrity-only`` (a fresh process:
   interpreter start and imports included) and (c) ``sha256sum`` of the engine file alone (a
   lower bound for any sha256-based check). All read the same, page-cache-warm bytes. Reports
   medians with 95% intervals from order statistics and the sample counts, and both ratios.
3. Bundles a run with a bigger engine (default 4 GiB) in a child process and reports its peak
   resident memory (``getrusage(RUSAGE_SELF).ru_maxrss``, and VmHWM from /proc, which a child
   cannot inherit), next to the child's memory right after its imports; then verifies that
   bundle in another child and reports its peak too.

Writes bench/results/bundle.json (with the command, date and host); the big files are deleted
afterwards. ``--smoke`` runs every step on a few MiB (CI runs it: tests/project/test_bench_smoke.py).

    python bench/bundle_bench.py [--verify-gib 1] [--memory-gib 4] [--repeats 9] [--work DIR]
"""

from __future__ import annotations

import argparse
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

from bench.provenance import cpu_model, provenance  # noqa: E402
from dossier.bundle import check_integrity, open_bundle, write_bundle  # noqa: E402
from dossier.hashing import digest_file  # noqa: E402
from dossier.measure.timing import median_ci  # noqa: E402
from dossier.run_folder import CACHE_NAME  # noqa: E402

GIB = 1 << 30
TUNE = """
import importlib.util, sys
from pathlib import Path
from dossier.spec import load_spec
from dossier.measure.timing import TimingSettings
from dossier.tuner import tune
build = importlib.util.spec_from_file_location("samples_build", "samples/build.py")
module = importlib.util.module_from_spec(build)
sys.modules["samples_build"] = module
build.loader.exec_module(module)
module.build_all(Path(sys.argv[1]))
spec = load_spec(Path(sys.argv[1]) / "convnet" / "release.toml",
                 {"selection": "-graph_optimization_level=[all|disable_all]"})
# small timing (the decision does not matter here, the bundle does): 6 rounds is the fewest
# the tuner accepts (a signed-rank p below alpha needs them), no confirmation round
spec = spec.model_copy(update={"timing": TimingSettings(
    samples=10, rounds=6, warmup_window=2, warmup_min_runs=1, warmup_max_s=0.2, confirm_top=0)})
tune(spec, Path(sys.argv[2]))
"""
CHILD = """
import json, resource, sys, time
from pathlib import Path
from dossier.bundle import check_integrity, open_bundle, write_bundle
def hwm():
    for line in open("/proc/self/status"):
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
start = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
start_hwm = hwm()
t0 = time.perf_counter()
if sys.argv[1] == "bundle":
    write_bundle(Path(sys.argv[2]), Path(sys.argv[3]))
else:
    with open_bundle(Path(sys.argv[2])) as b:
        assert check_integrity(b)
seconds = time.perf_counter() - t0
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(json.dumps({"after_imports_mib": start / 1024, "peak_mib": peak / 1024,
                  "after_imports_vmhwm_mib": start_hwm, "peak_vmhwm_mib": hwm(),
                  "seconds": seconds}))
"""


def _random_file(path: Path, size: int) -> None:
    rng = np.random.default_rng(20261130)
    block = 8 << 20
    with open(path, "wb") as f:
        left = size
        while left:
            n = min(block, left)
            f.write(rng.bytes(n))
            left -= n


def _run_with_engine(template: Path, dest: Path, size: int) -> Path:
    """A copy of the run folder ``template`` whose shipped engine is ``size`` random bytes."""
    shutil.copytree(template, dest)
    cache = dest / CACHE_NAME
    records = [json.loads(line) for line in cache.read_text().splitlines()]
    decision = next(r for r in records if r["kind"] == "decision")
    shipped = next(r for r in records if r["kind"] == "trial"
                   and r["index"] == decision["shipped_index"])
    engine = dest / shipped["engine"]
    _random_file(engine, size)
    digest = digest_file(engine)[0]
    for r in records:
        if r.get("engine") == shipped["engine"]:
            r["engine_digest"] = digest
    cache.write_text("".join(json.dumps(r) + "\n" for r in records))
    return dest


def _summary(samples: list[float]) -> dict[str, object]:
    lo, hi = median_ci(samples, 0.95)
    return {"median_s": float(np.median(samples)), "ci95_s": [lo, hi], "n": len(samples),
            "samples_s": samples}


def _child(*args: str) -> dict[str, float]:
    out = subprocess.run([sys.executable, "-c", CHILD, *args], check=True, capture_output=True,
                         text=True, cwd=ROOT)
    return json.loads(out.stdout)  # type: ignore[no-any-return]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--verify-gib", type=float, default=1.0)
    ap.add_argument("--memory-gib", type=float, default=4.0)
    ap.add_argument("--repeats", type=int, default=9)
    ap.add_argument("--work", type=Path, default=None, help="Scratch folder (default: system temp).")
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "bundle.json")
    ap.add_argument("--smoke", action="store_true",
                    help="every step on a few MiB, 3 repeats (checks that the script runs)")
    args = ap.parse_args()
    if args.smoke:
        args.verify_gib, args.memory_gib, args.repeats = 4 / 1024, 4 / 1024, 3
    made = provenance()
    dossier = str(Path(sys.executable).with_name("dossier"))
    if not shutil.which("sha256sum"):
        sys.exit("sha256sum is not installed")
    with tempfile.TemporaryDirectory(prefix="dossier-bundle-bench-", dir=args.work) as tmp:
        t = Path(tmp)
        # tune in a child: this process stays small, so the children it starts for the memory
        # measurement do not inherit a large peak (Linux folds the parent's peak RSS into a
        # vforked child's ru_maxrss at exec)
        subprocess.run([sys.executable, "-c", TUNE, str(t / "samples"), str(t / "run")],
                       check=True, cwd=ROOT)

        # ---- peak memory (first, while this process is still small)
        big = int(args.memory_gib * GIB)
        run = _run_with_engine(t / "run", t / "run-memory", big)
        bundled = _child("bundle", str(run), str(t / "out-memory"))
        shutil.rmtree(run)
        verified = _child("verify", str(t / "out-memory" / "convnet-1.dossier"))
        shutil.rmtree(t / "out-memory")

        # ---- verification speed
        size = int(args.verify_gib * GIB)
        run = _run_with_engine(t / "run", t / "run-verify", size)
        t0 = time.perf_counter()
        written = write_bundle(run, t / "out-verify")
        bundle_s = time.perf_counter() - t0
        shutil.rmtree(run)
        engine = written.path / written.manifest.engines.shipped.path
        total = sum(f.size for f in written.manifest.files)
        command = [dossier, "verify", str(written.path), "--integrity-only"]
        subprocess.run(command, check=True, capture_output=True, cwd=ROOT)  # compiles, warms
        xxh, whole, sha = [], [], []
        for i in range(args.repeats):
            order = ("xxh", "whole", "sha")
            for which in order if i % 2 == 0 else order[::-1]:
                t0 = time.perf_counter()
                if which == "xxh":
                    with open_bundle(written.path) as b:
                        assert check_integrity(b)
                    xxh.append(time.perf_counter() - t0)
                elif which == "whole":
                    subprocess.run(command, check=True, capture_output=True, cwd=ROOT)
                    whole.append(time.perf_counter() - t0)
                else:
                    subprocess.run(["sha256sum", str(engine)], check=True, capture_output=True)
                    sha.append(time.perf_counter() - t0)
        shutil.rmtree(written.path)
        x, w, s = _summary(xxh), _summary(whole), _summary(sha)
        speedup = s["median_s"] / x["median_s"]  # type: ignore[operator]
        speedup_ci = [s["ci95_s"][0] / x["ci95_s"][1], s["ci95_s"][1] / x["ci95_s"][0]]  # type: ignore[index]
        whole_speedup = s["median_s"] / w["median_s"]  # type: ignore[operator]
        whole_ci = [s["ci95_s"][0] / w["ci95_s"][1], s["ci95_s"][1] / w["ci95_s"][0]]  # type: ignore[index]

    result = {
        "benchmark": "bundle verification (xxh3-128 vs sha256sum) and writer peak memory",
        "provenance": made, "smoke": args.smoke,
        "host": {"machine": platform.machine(), "python": platform.python_version(),
                 "cpus": os.cpu_count(), "cpu": cpu_model()},
        "verify": {
            "engine_bytes": size, "bundle_bytes": total,
            "method": "alternating repeats on page-cache-warm files; xxh3 = check_integrity of "
                      "the whole bundle (every file) in this process, whole command = `dossier "
                      "verify BUNDLE --integrity-only` (a fresh process each time), sha256 = "
                      "`sha256sum` of the engine only",
            "xxh3_check_integrity": x, "whole_command": w, "sha256sum_engine": s,
            "xxh3_gib_per_s": total / GIB / x["median_s"],  # type: ignore[operator]
            "sha256_gib_per_s": size / GIB / s["median_s"],  # type: ignore[operator]
            "speedup_median": speedup, "speedup_ci95_conservative": speedup_ci,
            "whole_command_speedup_median": whole_speedup,
            "whole_command_speedup_ci95_conservative": whole_ci,
            "goal": ">= 5x faster than sha256sum", "goal_met": speedup >= 5,
            "bundle_write_s": bundle_s,
        },
        "memory": {
            "engine_bytes": big,
            "bundle": bundled, "verify": verified,
            "goal": "peak < 200 MB while bundling",
            "goal_met": max(bundled["peak_mib"], bundled["peak_vmhwm_mib"]) * 1.048576 < 200,
        },
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"verify {size / GIB:g} GiB engine: xxh3 check_integrity {x['median_s']:.3f} s "
          f"[{x['ci95_s'][0]:.3f}, {x['ci95_s'][1]:.3f}] n={x['n']}; sha256sum "  # type: ignore[index]
          f"{s['median_s']:.3f} s [{s['ci95_s'][0]:.3f}, {s['ci95_s'][1]:.3f}] n={s['n']}; "  # type: ignore[index]
          f"{speedup:.1f}x [{speedup_ci[0]:.1f}, {speedup_ci[1]:.1f}]; whole command "
          f"{w['median_s']:.3f} s [{w['ci95_s'][0]:.3f}, {w['ci95_s'][1]:.3f}]: "  # type: ignore[index]
          f"{whole_speedup:.1f}x [{whole_ci[0]:.1f}, {whole_ci[1]:.1f}]")
    print(f"bundle {big / GIB:g} GiB engine: peak RSS {bundled['peak_mib']:.0f} MiB "
          f"(VmHWM {bundled['peak_vmhwm_mib']:.0f}; after imports "
          f"{bundled['after_imports_mib']:.0f}), {bundled['seconds']:.1f} s; verify peak "
          f"{verified['peak_mib']:.0f} MiB (VmHWM {verified['peak_vmhwm_mib']:.0f}), "
          f"{verified['seconds']:.1f} s")


if __name__ == "__main__":
    main()
