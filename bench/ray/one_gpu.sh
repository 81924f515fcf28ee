#!/usr/bin/env bash
# The Ray executor on one GPU host: the same ONNX Runtime convnet search (full, 12 routes) with
# --executor local and with --executor ray (a local Ray instance that sees the host's GPUs: one
# measure actor per GPU), each run REPS times; records wall time, trials per hour, outcomes,
# decisions and which worker/GPU measured each trial.
#
# usage: OUT=DIR bench/ray/one_gpu.sh     (wheels in .whl/ are installed to /tmp/site when
#                                           ray or pydantic is missing; PYTHON: python3)
#        SMOKE=1: one run of each over two routes, small timing (CI runs it on CPU:
#                 tests/test_bench_smoke.py); SELECTION=...: another selection than the spec's;
#        EXECUTORS="local ray" (the default): which executors to run
# writes: $OUT/ray-one-gpu.json (with the command, date and host), $OUT/ray-one-gpu.log
set -u
cd "$(dirname "$0")/../.." || exit 2
REPO=$(pwd)
PY=${PYTHON:-python3}
OUT=${OUT:?set OUT}
SMOKE=${SMOKE:-}
REPS=${REPS:-2}
SELECTION=${SELECTION:-}
EXECUTORS=${EXECUTORS:-local ray}
SAMPLES=30
if [ -n "$SMOKE" ]; then
  REPS=1 SAMPLES=10
  SELECTION=${SELECTION:-"-graph_optimization_level=[all|disable_all]"}
fi
WORK=${WORK:-/tmp/ray-bench}
LOG="$OUT/ray-one-gpu.log"
mkdir -p "$OUT" "$WORK"
# the CLI's folder cli/ is the package dossier_cli once installed; uninstalled (the GPU machine
# runs from the checkout), a link of that name makes it importable
mkdir -p "$REPO/bench/work/pkgs" && ln -sfn "$REPO/cli" "$REPO/bench/work/pkgs/dossier_cli"
export PYTHONPATH="$REPO:$REPO/bench/work/pkgs" PYTHONUNBUFFERED=1
if ! "$PY" -c "import ray, pydantic" 2>/dev/null && ls .whl/*.whl >/dev/null 2>&1; then
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site \
        .whl/*.whl >>"$LOG" 2>&1
    export PYTHONPATH="$PYTHONPATH:/tmp/site"
fi
{ nvidia-smi -L; "$PY" -c "import ray, onnxruntime; print('ray', ray.__version__, 'ort', onnxruntime.__version__)"; } >>"$LOG" 2>&1
"$PY" - "$WORK" <<'PY' >>"$LOG" 2>&1
import importlib.util, sys
from pathlib import Path
spec = importlib.util.spec_from_file_location("samples_build", "samples/build.py")
m = importlib.util.module_from_spec(spec); sys.modules["samples_build"] = m
spec.loader.exec_module(m); m.build_all(Path(sys.argv[1]) / "samples")
PY
SPEC="$WORK/samples/convnet/release.toml"
# 6 rounds: the fewest with which the signed-rank test can reach p < alpha (tune refuses fewer)
printf '\n[timing]\nsamples = %s\nrounds = 6\n' "$SAMPLES" >>"$SPEC"
rm -rf "$WORK/runs"
failed=0
for rep in $(seq "$REPS"); do
  for ex in $EXECUTORS; do
    run="$WORK/runs/$ex-$rep"
    "$PY" -m dossier_cli.main tune "$SPEC" --out "$run" --quiet --executor "$ex" \
        ${SELECTION:+--selection "$SELECTION"} >>"$LOG" 2>&1 || { echo "$ex-$rep failed: $?" >>"$LOG"; failed=1; }
  done
done
[ "$failed" = 0 ] || { tail -20 "$LOG" >&2; exit 1; }
"$PY" - "$WORK/runs" "$OUT/ray-one-gpu.json" "bench/ray/one_gpu.sh" "$SMOKE" <<'PY' >>"$LOG" 2>&1
import json, sys
from pathlib import Path
from bench.provenance import provenance
runs = {}
for d in sorted(Path(sys.argv[1]).iterdir()):
    recs = [json.loads(l) for l in (d / "tuning-cache.jsonl").read_text().splitlines()]
    trials = [r for r in recs[1:] if r["kind"] == "trial" and r["role"] != "confirm"]
    sessions = [r for r in recs[1:] if r["kind"] == "session"]
    dec = next((r for r in recs[1:] if r["kind"] == "decision"), {})
    wall = sum(s["wall_s"] for s in sessions)
    fp = json.loads((d / "fingerprint.json").read_text())
    runs[d.name] = {
        "wall_s": wall, "trials": len(trials), "trials_per_hour": 3600 * len(trials) / wall,
        "outcomes": {r["route"]: r["outcome"] for r in trials},
        "shipped_route": dec.get("shipped_route"), "gain": dec.get("gain"),
        "speedup": dec.get("speedup"),
        "measured_on": sorted({r["extra"].get("worker_gpu", "-") for r in trials}),
        "fingerprint_gpus": [g.get("name") for g in fp.get("gpus", [])],
        "phases_s_median": {k: sorted(r["phases_s"].get(k, 0) for r in trials)[len(trials) // 2]
                            for k in ("build", "time")}}
made = provenance([sys.argv[3]])
made["command"] = " ".join(f"{k}={v}" for k, v in (("SMOKE", sys.argv[4]),) if v) + \
    (" " if sys.argv[4] else "") + "OUT=DIR bench/ray/one_gpu.sh"
json.dump({"provenance": made, "smoke": bool(sys.argv[4]), "runs": runs}, open(sys.argv[2], "w"),
          indent=1)
print(json.dumps(runs, indent=1))
PY
