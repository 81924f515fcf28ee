"""What a serving host installs: the distributions that ``dossier.load`` of an ONNX Runtime
bundle (verify, load, one call) imports, and their installed size.

Runs the load in a fresh interpreter, maps every imported top-level module to the distribution
that provides it (``importlib.metadata.packages_distributions``), and sums the sizes on disk of
the files each distribution's RECORD lists (``dist.files``). For contrast: the same sum for
dossier's core dependencies (its requirements without extras, recursively) as installed here.
Modules the interpreter imported before the load (site, .pth hooks) and standard-library
modules count for nothing.

Writes bench/results/serve-footprint.json.

    python bench/serve_footprint.py [--bundle B] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import subprocess
import sys
from importlib import metadata
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
GOLDEN = ROOT / "tests" / "assets" / "golden" / "convnet-1.dossier"

_PROBE = """
import json, sys
before = {m.split(".")[0] for m in sys.modules}  # what the interpreter's start imported
import numpy as np
import dossier
engine = dossier.load(sys.argv[1], host=sys.argv[2])
engine({"x": np.zeros((1, 3, 32, 32), np.float32)})
print(json.dumps(sorted({m.split(".")[0] for m in sys.modules} - before)))
"""


def _size(dist: metadata.Distribution) -> int:
    paths = [Path(str(dist.locate_file(f))) for f in dist.files or []]
    return sum(p.stat().st_size for p in paths if p.is_file())


def _key(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _requirements(name: str, seen: set[str]) -> None:
    """``name`` and what it requires, recursively, without extras, as installed here."""
    key = _key(name)
    if key in seen:
        return
    try:
        dist = metadata.distribution(name)
    except metadata.PackageNotFoundError:
        return
    seen.add(key)
    for req in dist.requires or []:
        if "extra ==" in req.replace("extra==", "extra =="):
            continue
        dep = re.split(r"[\s;<>=!~\[(]", req, maxsplit=1)[0]
        if dep:
            _requirements(dep, seen)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bundle", type=Path, default=GOLDEN)
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results" /
                    "serve-footprint.json")
    args = ap.parse_args()
    host = args.bundle / "fingerprint.json"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(ROOT), str(ROOT / ".shim"), os.environ.get("PYTHONPATH", "")])}
    res = subprocess.run([sys.executable, "-c", _PROBE, str(args.bundle), str(host)],
                         capture_output=True, text=True, check=True, env=env)
    modules = json.loads(res.stdout.splitlines()[-1])
    providers = metadata.packages_distributions()
    dists = sorted({_key(d) for m in modules for d in providers.get(m, [])} - {"dossier"})
    sizes = {d: _size(metadata.distribution(d)) for d in dists}
    everything: set[str] = set()
    _requirements("dossier", everything)
    everything.discard("dossier")
    full = {d: _size(metadata.distribution(d)) for d in sorted(everything)}
    serving = sum(sizes.values())
    closure: set[str] = set()  # what pip installs for them: their requirements too
    for d in dists:
        _requirements(d, closure)
    pulled = {d: _size(metadata.distribution(d)) for d in sorted(closure - set(dists))}
    result = {
        "what": "distributions imported by dossier.load of an ONNX Runtime bundle (verify, "
                "load, one call), with their installed size from each RECORD; dossier itself "
                "not counted",
        "bundle": str(args.bundle.relative_to(ROOT)) if args.bundle.is_relative_to(ROOT)
        else str(args.bundle),
        "serving_distributions": {d: {"version": metadata.version(d), "bytes": s}
                                  for d, s in sizes.items()},
        "serving_total_mib": round(serving / 2**20, 1),
        "required_by_them_not_imported": pulled,
        "serving_with_their_requirements_mib": round((serving + sum(pulled.values())) / 2**20,
                                                     1),
        "core_dependencies_installed_here": dict(full.items()),
        "core_dependencies_total_mib": round(sum(full.values()) / 2**20, 1),
        "not_imported_by_load": sorted(set(full) - set(sizes)),
        "host": {"machine": platform.machine(), "python": platform.python_version()},
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    for d, s in sizes.items():
        print(f"{d:24} {metadata.version(d):12} {s / 2**20:8.1f} MiB")
    print(f"required by them, not imported: {', '.join(pulled)}: with them "
          f"{result['serving_with_their_requirements_mib']} MiB")
    print(f"serving total {result['serving_total_mib']} MiB; dossier's core dependencies "
          f"installed here {result['core_dependencies_total_mib']} MiB")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
