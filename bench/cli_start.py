"""How fast the ``dossier`` command starts: wall time of whole commands, and what they import.

Times, interleaved round by round so that load on the machine spreads over all of them:
``python -c pass`` (the interpreter alone), ``dossier --help``, ``dossier verify --help`` and
``dossier verify GOLDEN --integrity-only`` on the small golden bundle of the tests. Each is a
fresh process of the installed console script. The package's sources are compiled first (as
installing a wheel does; an editable install with ``PYTHONDONTWRITEBYTECODE`` set would
otherwise compile them on every run). Reports the median with its 95% interval from order
statistics, the minimum and the sample count; then, from ``python -X importtime``, the modules
that take longest to import for ``dossier --help``, and which heavy libraries each command
imported at all.

Writes bench/results/cli-start.json, with the command, date and host. ``--smoke`` times 2
rounds (CI runs it: tests/project/test_bench_smoke.py).

    python bench/cli_start.py [--runs 15] [--compare OTHER/.venv/bin/dossier]
"""

from __future__ import annotations

import argparse
import compileall
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.provenance import provenance  # noqa: E402
from dossier.measure.timing import median_ci  # noqa: E402

GOLDEN = ROOT / "tests" / "assets" / "golden" / "convnet-1.dossier"
HEAVY = ("numpy", "pyarrow", "onnxruntime", "onnx", "torch", "scipy", "pydantic", "rich",
         "dossier.tuner", "dossier.backends", "dossier.trust.signing")
"""Libraries a command should import only when it uses them."""
PROBE = ("import runpy, sys; sys.argv = ['dossier', *sys.argv[1:]]\n"
         "try:\n    runpy.run_module('dossier_cli.main', run_name='__main__')\n"
         "except SystemExit:\n    pass\n"
         "sys.stderr.write('\\nLOADED ' + ' '.join(sorted(m for m in {heavy} if m in sys.modules)))\n")


def commands(compare: Path | None) -> dict[str, list[str]]:
    """The commands timed; with ``compare`` (another installation's ``dossier`` script, e.g.
    of the previous version) its ``--help``, ``verify --help`` and integrity check too."""
    exe = Path(sys.executable)
    dossier = str(exe.with_name("dossier"))
    other = {} if compare is None else {
        f"{compare} --help": [str(compare), "--help"],
        f"{compare} verify --help": [str(compare), "verify", "--help"],
        f"{compare} verify GOLDEN --integrity-only": [str(compare), "verify", str(GOLDEN),
                                                     "--integrity-only"]}
    return {**other, "python -c pass": [str(exe), "-c", "pass"],
            "dossier --help": [dossier, "--help"],
            "dossier verify --help": [dossier, "verify", "--help"],
            "dossier verify GOLDEN --integrity-only": [dossier, "verify", str(GOLDEN),
                                                       "--integrity-only"]}


def compile_sources() -> None:
    """Byte-compile dossier/ and cli/ (the .pyc files a wheel's installation writes)."""
    for folder in ("dossier", "cli"):
        compileall.compile_dir(ROOT / folder, quiet=1)


def time_once(argv: list[str]) -> float:
    """Wall time of one run; a leading ``NAME=value`` sets an environment variable."""
    env = {**os.environ, "COLUMNS": "100"}
    while "=" in argv[0]:
        key, value = argv[0].split("=", 1)
        env[key] = value
        argv = argv[1:]
    t0 = time.perf_counter()
    res = subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env,
                         check=False)
    elapsed = time.perf_counter() - t0
    if res.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} exited {res.returncode}")
    return elapsed


def loaded(args: list[str]) -> list[str]:
    """The HEAVY modules the command imported (run in-process through runpy)."""
    res = subprocess.run([sys.executable, "-c", PROBE.format(heavy=HEAVY), *args],
                         capture_output=True, text=True, check=False)
    line = res.stderr.rsplit("LOADED", 1)[-1]
    return line.split()


def import_times(args: list[str], top: int = 8) -> list[dict[str, object]]:
    """The modules with the largest cumulative import time (microseconds) for a command."""
    res = subprocess.run([sys.executable, "-X", "importtime", "-m", "dossier_cli.main", *args],
                         capture_output=True, text=True, check=False)
    rows = []
    for line in res.stderr.splitlines():
        parts = line[len("import time:"):].split("|")
        if not line.startswith("import time:") or len(parts) != 3 or not parts[1].strip().isdigit():
            continue
        name = parts[2]
        if len(name) - len(name.lstrip()) == 1:  # imported by the command itself, not nested
            rows.append({"module": name.strip(), "cumulative_us": int(parts[1])})
    return sorted(rows, key=lambda r: -int(str(r["cumulative_us"])))[:top]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=15, help="rounds (each times every command once)")
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "cli-start.json")
    ap.add_argument("--compare", type=Path, help="another installation's dossier script to time "
                    "alongside (e.g. the previous version's)")
    ap.add_argument("--smoke", action="store_true", help="2 rounds (checks that the script runs)")
    a = ap.parse_args()
    made = provenance()
    if a.smoke:
        a.runs = 2
    cmds = commands(a.compare)
    compile_sources()
    for argv in cmds.values():
        time_once(argv)  # warm the page cache and the .pyc files
    samples: dict[str, list[float]] = {name: [] for name in cmds}
    for _ in range(a.runs):
        for name, argv in cmds.items():
            samples[name].append(time_once(argv))
    results = {}
    for name, xs in samples.items():
        xs = sorted(xs)
        lo, hi = median_ci(xs, 0.95)
        results[name] = {"n": len(xs), "median_s": round(statistics.median(xs), 4),
                         "ci95_s": [round(lo, 4), round(hi, 4)], "min_s": round(xs[0], 4)}
        print(f"{name:<60} median {statistics.median(xs):.3f} s  95% CI "
              f"[{lo:.3f}, {hi:.3f}]  min {xs[0]:.3f} s  n={len(xs)}")
    imports = {"dossier --help": loaded(["--help"]),
               "dossier verify --help": loaded(["verify", "--help"]),
               "dossier verify GOLDEN --integrity-only": loaded(["verify", str(GOLDEN),
                                                                 "--integrity-only"])}
    for name, mods in imports.items():
        print(f"{name:<42} imports: {', '.join(mods) or '(none of ' + ', '.join(HEAVY) + ')'}")
    report = {
        "test": "cli start", "provenance": made, "smoke": a.smoke,
        "host": platform.node(), "cpus": os.cpu_count(),
        "load_average": list(os.getloadavg()), "python": platform.python_version(),
        "note": "wall time of a fresh process per run, rounds interleaved, sources compiled "
                "first; median with its 95% interval from order statistics",
        "compared_with": str(a.compare) if a.compare else None,
        "commands": results, "heavy_modules_checked": list(HEAVY), "heavy_imported": imports,
        "slowest_imports_help": import_times(["--help"]),
    }
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
