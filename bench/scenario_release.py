"""A ``[scenario]`` release over AOTInductor engine instances, end to end: ``dossier release`` of a
spec whose selection varies ``-serving_sessions`` on the CUDA-graph route, so that the release's
scenario stage (each LoadGen run in a child process that loads the engine once per instance)
decides among them; then ``inspect`` and ``explain``::

    OUT=DIR python bench/scenario_release.py --config tiny_convnet_b4 --out $OUT

The model and validation set are ``bench/h200/make_specs.py``'s; the spec is written here (the
settings are short: this shows the pipeline on the GPU, it is not a figure of merit).
``--device cpu`` runs it on a CPU host (the instances share the cores there).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
for p in (ROOT, ROOT / "bench" / "h200"):
    if str(p) not in sys.path:
        sys.path.insert(0, str(p))

SCENARIO = """
[scenario]
kind = "server"
latency_ms = {bound}
percentile = 99.0
duration_s = {duration}
min_queries = 100
search_steps = {steps}
processes = {processes}
run_timeout_s = 60.0
"""


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    p.add_argument("--config", default="tiny_convnet_b4")
    p.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    p.add_argument("--bound-ms", type=float, default=5.0)
    p.add_argument("--duration-s", type=float, default=0.5)
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--processes", type=int, default=2)
    p.add_argument("--work", type=Path, default=ROOT / "bench" / "work" / "scenario-release")
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args(argv)
    from make_specs import CONFIGS, TINY_CONFIGS, spec_text, write_config

    factory, batch = {**CONFIGS, **TINY_CONFIGS}[args.config]
    meta = write_config(args.work, args.config, factory, batch, device=args.device,
                        ref_device=args.device, dtype="float32", pairs=2,
                        tiny=args.config in TINY_CONFIGS, force=False)
    folder = args.work / "specs" / args.config
    graph = "-cuda_graph=on " if args.device == "cuda" else ""
    selection = f"{graph}-device={args.device} -dtype=float32 -serving_sessions=[1|2]"
    timing = {"samples": 20, "rounds": 6, "warmup_max_s": 1.0, "confirm_top": 2,
              "trial_timeout_s": 300.0}
    spec = folder / "release-scenario.toml"
    spec.write_text(spec_text(f"scenario-{args.config}", "engine instances under a server "
                              "scenario", selection, timing, 1e-3)
                    + SCENARIO.format(bound=args.bound_ms, duration=args.duration_s,
                                      steps=args.steps, processes=args.processes))
    args.out.mkdir(parents=True, exist_ok=True)
    releases = args.out / "releases"
    t0 = time.monotonic()
    res = subprocess.run([sys.executable, "-m", "dossier_cli.main", "release", str(spec),
                          "--out", str(releases)], capture_output=True, text=True)
    doc = {"command": "python bench/scenario_release.py " + " ".join(
        argv if argv is not None else sys.argv[1:]), "spec": spec.read_text(),
           "meta": meta, "release_rc": res.returncode,
           "release_s": round(time.monotonic() - t0, 1), "release_stderr": res.stderr[-6000:]}
    bundles = sorted(releases.glob("*.dossier"))
    if bundles:
        for cmd in ("inspect", "explain"):
            got = subprocess.run([sys.executable, "-m", "dossier_cli.main", cmd,
                                  str(bundles[-1])], capture_output=True, text=True)
            doc[cmd] = got.stdout[-8000:] + got.stderr[-1000:]
    (args.out / "scenario-release.json").write_text(json.dumps(doc, indent=2) + "\n")
    print(json.dumps({k: v for k, v in doc.items() if k in ("release_rc", "release_s")}))
    print(doc.get("inspect", res.stderr[-3000:]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
