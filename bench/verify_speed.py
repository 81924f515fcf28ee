"""Whole-command speed of ``dossier verify --integrity-only`` on a bundle with a big engine, and
how many bytes it reads.

1. Copies the golden 1.0 bundle (tests/assets/golden) into a temporary folder and swaps its
   engine for a file of random bytes (default 1 GiB), recording the new size and xxh3-128 in the
   manifest and re-sealing its dossier id: a valid bundle whose engine dominates its size.
2. Runs ``dossier verify BUNDLE --integrity-only`` (the installed entry point, a fresh process
   each time, the package's sources compiled first) once to warm the page cache, then
   ``--repeats`` times, and reports the median wall time with a 95% interval from order
   statistics, the range and the sample count. Interleaved with it, round by round: the imports
   alone (``python -c 'import dossier_cli.main'``) and the interpreter alone (``python -c
   pass``, which says how loaded the host was). Alongside: the same command's
   ``/proc/self/io`` ``rchar`` (bytes read through read(2) and friends, page cache included)
   against the bundle's size; the time of the in-process check alone (``open_bundle`` +
   ``check_integrity``); and the same command on the bundle signed with a fresh key (xxh3-128
   and BLAKE3 from one read of each file).

Writes bench/results/verify-speed.json (with the command, date and host); the temporary folder
is removed. ``--smoke`` runs every step on a 4 MiB engine, 2 repeats (CI runs it:
tests/project/test_bench_smoke.py).

    python bench/verify_speed.py [--gib 1] [--repeats 9] [--work DIR] [--out FILE]
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

ROOT = Path(__file__).resolve().parents[1]
GOLDEN = ROOT / "tests" / "assets" / "golden" / "convnet-1.dossier"
RCHAR = """
import atexit, sys
def said():
    for line in open("/proc/self/io"):
        if line.startswith("rchar:"):
            sys.stderr.write("RCHAR " + line.split()[1] + "\\n")
atexit.register(said)
from dossier_cli.main import main
sys.argv = ["dossier", *sys.argv[1:]]
main()
"""


def make_bundle(dst: Path, engine_bytes: int) -> Path:
    """A copy of the golden bundle at ``dst`` whose engine is ``engine_bytes`` random bytes,
    with the manifest's file table and engine entries updated and the dossier id re-sealed."""
    from dossier.bundle.manifest import MANIFEST_NAME, body_digest
    from dossier.hashing import digest_file

    shutil.copytree(GOLDEN, dst)
    raw = json.loads((dst / MANIFEST_NAME).read_bytes())
    rel = raw["engines"]["shipped"]["path"]
    block = os.urandom(min(engine_bytes, 64 << 20))
    with open(dst / rel, "wb") as f:
        left = engine_bytes
        while left > 0:
            left -= f.write(block[:left])
    digest, size = digest_file(dst / rel)
    for entry in [*raw["files"], *(e for e in raw["engines"].values() if e)]:
        if entry["path"] == rel:
            entry.update(size=size, digest=digest)
    raw["dossier_id"] = body_digest(raw)
    (dst / MANIFEST_NAME).write_text(json.dumps(raw, indent=2, sort_keys=True) + "\n")
    return dst


def bundle_size(path: Path) -> int:
    """Bytes of every file under ``path``."""
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def _stats(samples: list[float]) -> dict[str, object]:
    from dossier.measure.timing import median_ci

    lo, hi = median_ci(samples, 0.95)
    ordered = sorted(samples)
    return {"median_s": round(ordered[len(ordered) // 2], 4), "ci95_s": [round(lo, 4),
                                                                        round(hi, 4)],
            "min_s": round(ordered[0], 4), "max_s": round(ordered[-1], 4), "n": len(samples),
            "samples_s": [round(x, 4) for x in samples]}


def _time(*cmds: list[str], repeats: int) -> list[dict[str, object]]:
    """Each of ``cmds`` ``repeats`` times, interleaved round by round (so that the host's load
    spreads over all of them), after one dropped round that warms the page cache."""
    samples: list[list[float]] = [[] for _ in cmds]
    for _ in range(repeats + 1):
        for cmd, xs in zip(cmds, samples, strict=True):
            start = time.perf_counter()
            res = subprocess.run(cmd, capture_output=True, check=False, cwd=ROOT)
            took = time.perf_counter() - start
            if res.returncode != 0:
                raise SystemExit(f"{cmd} exited {res.returncode}: {res.stderr.decode()[-400:]}")
            xs.append(took)
    return [_stats(xs[1:]) for xs in samples]


def _rchar(bundle: Path, *extra: str) -> int:
    res = subprocess.run([sys.executable, "-c", RCHAR, "verify", str(bundle), "--integrity-only",
                          *extra], capture_output=True, check=False, cwd=ROOT)
    lines = [x for x in res.stderr.decode().splitlines() if x.startswith("RCHAR ")]
    if res.returncode != 0 or not lines:
        raise SystemExit(f"verify exited {res.returncode}: {res.stderr.decode()[-400:]}")
    return int(lines[-1].split()[1])


def _in_process(bundle: Path, repeats: int) -> dict[str, object]:
    from dossier.bundle import check_integrity, open_bundle

    samples = []
    for _ in range(repeats + 1):
        start = time.perf_counter()
        with open_bundle(bundle, lazy=True) as b:
            assert check_integrity(b)
        samples.append(time.perf_counter() - start)
    return _stats(samples[1:])


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    ap.add_argument("--gib", type=float, default=1.0)
    ap.add_argument("--repeats", type=int, default=9)
    ap.add_argument("--work", type=Path, default=None)
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "verify-speed.json")
    ap.add_argument("--smoke", action="store_true",
                    help="a 4 MiB engine, 2 repeats (checks that the script runs)")
    args = ap.parse_args()
    if args.smoke:
        args.gib, args.repeats = 4 / 1024, 2
    sys.path.insert(0, str(ROOT))
    from cli_start import compile_sources

    from bench.provenance import provenance
    from dossier.trust.signing import generate_key_pair, sign_bundle

    made = provenance()

    compile_sources()  # as a wheel's installation does (see bench/cli_start.py)
    dossier = str(Path(sys.executable).with_name("dossier"))
    work = Path(tempfile.mkdtemp(prefix="verify-speed-", dir=args.work))
    try:
        bundle = make_bundle(work / "convnet-1.dossier", int(args.gib * (1 << 30)))
        os.sync()  # the engine just written is flushed before timing starts, not during it
        size = bundle_size(bundle)
        cmd = [dossier, "verify", str(bundle), "--integrity-only"]
        whole, imports, interpreter = _time(
            cmd, [sys.executable, "-c", "import dossier_cli.main"], [sys.executable, "-c", "pass"],
            repeats=args.repeats)
        check = _in_process(bundle, args.repeats)
        rchar = _rchar(bundle)
        keys = generate_key_pair(work / "keys")
        sign_bundle(bundle, keys.private)
        signed, = _time([*cmd, "--trusted-key", str(keys.public)],
                        repeats=args.repeats if args.smoke else max(3, args.repeats // 2))
        rchar_signed = _rchar(bundle, "--trusted-key", str(keys.public))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    result = {
        "provenance": made, "smoke": args.smoke,
        "what": "dossier verify BUNDLE --integrity-only, whole command (a fresh process per "
                "run, page cache warm, first run dropped), on the golden bundle with its engine "
                f"swapped for {args.gib:g} GiB of random bytes",
        "bundle_bytes": size,
        "engine_bytes": int(args.gib * (1 << 30)),
        "whole_command": whole,
        "imports_only": {"command": "python -c 'import dossier_cli.main'", **imports},
        "interpreter_only": {"command": "python -c pass", **interpreter},
        "check_in_process": {"what": "open_bundle + check_integrity (one scan)", **check},
        "rchar": {"bytes": rchar, "ratio_to_bundle": round(rchar / size, 4)},
        "signed": {"what": "the same bundle signed; xxh3-128 and BLAKE3 from one read",
                   **signed, "rchar": rchar_signed,
                   "rchar_ratio_to_bundle": round(rchar_signed / size, 4)},
        "target_s": 0.5,
        "host": {"machine": platform.machine(), "cpus": os.cpu_count(),
                 "python": platform.python_version()},
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
