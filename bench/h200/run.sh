#!/usr/bin/env bash
# The H200 benchmark of the torch-inductor backend: eager and torch.compile timings, dossier
# tune with fast / mixed / full (each followed by a fresh-process re-measurement of its winner),
# and A/A repetitions. A failed step is recorded and the next one runs.
#
# usage: OUT=DIR bench/h200/run.sh STEP [STEP ...]
#
#   setup              record the software and the GPU (always first; wheels in .whl/ are
#                      installed to /tmp/site when pydantic is missing)
#   specs[=C1,C2]      specs, exported programs, validation sets (bench/h200/make_specs.py)
#   eager[=C1,C2]      eager and torch.compile (default mode) timings
#   tune=C:S1,S2       dossier tune of config C with each strategy (fast|mixed|full)
#   aa=C:N             N A/A searches of config C (warm shared inductor cache, dossier's build
#                      cache: the first builds, the others measure)
#   calib=C:N          N searches of config C's calibration spec (-cuda_graph=[off|on]), each
#                      shipped gain re-measured independently (coverage); build cache as aa
#   release=C:N        N fast searches of config C's search spec (release.toml: every knob),
#                      build cache as aa: how often the CUDA-graph route ships with the
#                      other knobs beside it
#   bundle=RUN         bundle run RUN of this tag (or, for a repeated step such as
#                      resnet50_b1-calib, its last run that shipped a gain), verify it
#                      (--recheck --rebench), explain it as HTML into $OUT
#   serve=RUN          bundle run RUN as bundle= picks it (../TAG/RUN: a run of an earlier
#                      tag on the same warm machine), then time to first inference after
#                      dossier.load in 3 fresh processes and bench/load_parity.py on it
#   procvar=RUN:N      process-to-process variance: N fresh-process re-measurements of the
#                      baseline against itself and of the best route of run RUN (a folder of
#                      this tag's runs, e.g. resnet50_b1-full or resnet50_b1-aa-00)
#   gpu1|gpu2          the issue-11 results in two commands of <= 9.5 minutes (see docs/results.md);
#   gpu3               BERT b1, ResNet-50 b32 and BERT b32 fast searches, if budget remains
#   gpu4               what the 2026-12-01 runs left: the batch-32 fast searches, a ResNet-50
#                      bundle verified there (with its HTML report when plotly was carried),
#                      3 more A/A searches and more calibration searches (two commands:
#                      gpu4a, gpu4b)
#   gpu5               what was left after gpu4 (three commands of <= 9.5 minutes, in this
#                      order on one warm machine, so that the build cache carries over):
#                      gpu5a calibration searches of ResNet-50 b1 in 3 process generations;
#                      gpu5b 3 A/A searches, a ResNet-50 fast search bundled, verified and
#                      explained as HTML, more calibration; gpu5c the batch-32 fast searches
#   gpu6               what the e-runs left, with the process-generation interval (the specs
#                      confirm in 3 generations): gpu6a a prospective calibration of ResNet-50
#                      b1; gpu6b a ResNet-50 b1 fast search bundled and verified, then mixed;
#                      gpu6c eager and torch.compile at batch 32
#   plan1|plan2|plan3  an older split into three commands
#   smoke              a CPU smoke test: BENCH_TINY=1 BENCH_DEVICE=cpu
#
# configs: resnet50_b1 resnet50_b32 bert_b1 bert_b32 (tiny: tiny_mlp_b8 tiny_convnet_b4)
# env: OUT (required)  BENCH_WORK (bench/work/h200)  DEADLINE_S (540, for the whole command)
#      BENCH_DEVICE (cuda)  BENCH_TINY (0)  BENCH_TAG (UTC time)  PYTHON (python3)
#      BENCH_BUILD_JOBS (dossier tune --build-jobs; default: dossier's, from the cores)
# writes: $OUT/h200-$TAG.json (all step records), $OUT/h200-$TAG.log, $OUT/caches-$TAG.tar.gz
set -u
cd "$(dirname "$0")/../.." || exit 2
REPO=$(pwd)
PY=${PYTHON:-python3}
OUT=${OUT:?set OUT to the folder the results go to}
WORK=${BENCH_WORK:-$REPO/bench/work/h200}
DEADLINE_S=${DEADLINE_S:-540}
export BENCH_DEVICE=${BENCH_DEVICE:-cuda}
TINY=${BENCH_TINY:-0}
TAG=${BENCH_TAG:-$(date -u +%Y%m%dT%H%M%SZ)}
START=$(date +%s)
RESULTS="$WORK/results/$TAG"
LOG="$OUT/h200-$TAG.log"
mkdir -p "$OUT" "$RESULTS" "$WORK/runs/$TAG"
# the CLI's folder cli/ is the package dossier_cli once installed; uninstalled (the GPU machine
# runs from the checkout), a link of that name makes it importable
mkdir -p "$REPO/bench/work/pkgs" && ln -sfn "$REPO/cli" "$REPO/bench/work/pkgs/dossier_cli"
export PYTHONPATH="$REPO:$REPO/bench/work/pkgs${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
if [ "$TINY" = 1 ]; then ALL="tiny_mlp_b8,tiny_convnet_b4"; TINYFLAG=--tiny
else ALL="resnet50_b1,resnet50_b32,bert_b1,bert_b32"; TINYFLAG=; fi

WHEELS=${BENCH_WHEELS:-$( [ -d .whl ] && echo .whl || echo ../.whl )}
if ! "$PY" -c "import pydantic" 2>/dev/null && ls "$WHEELS"/*.whl >/dev/null 2>&1; then
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/site "$WHEELS"/*.whl >>"$LOG" 2>&1
    export PYTHONPATH="/tmp/site:$PYTHONPATH"
fi
# backends are found through the package's entry points: an uninstalled checkout registers
# none ("unknown backend"), so install it in place (no dependencies, no index) when needed
if ! "$PY" -c "import importlib.metadata as m, sys; sys.exit(0 if m.entry_points(group='dossier.backends') else 1)" 2>/dev/null; then
    "$PY" -m pip install -q --no-deps --no-index --no-build-isolation -e "$REPO" >>"$LOG" 2>&1
fi

N=0
left() { echo $(( DEADLINE_S - ($(date +%s) - START) )); }
note() { echo "[$(date -u +%H:%M:%S) +$(( $(date +%s) - START ))s] $*" | tee -a "$LOG" >&2; }
merge() {
    "$PY" bench/h200/steps.py merge --dir "$RESULTS" --out "$OUT/h200-$TAG.json" --tag "$TAG" \
        >>"$LOG" 2>&1
    (cd "$WORK/runs" && find "$TAG" -name tuning-cache.jsonl -o -name knobs.json \
        -o -name fresh.json | tar czf "$OUT/caches-$TAG.tar.gz" -T - ) 2>>"$LOG"
}
# run NAME MIN_S CMD...: run CMD with what is left of the deadline (it gets --timeout), record it
run() {
    local name=$1 min=$2; shift 2
    N=$((N + 1))
    local file; file="$RESULTS/$(printf %02d $N)-${name//\//_}.json"  # serve=../TAG/RUN: no slash
    local budget; budget=$(left)
    if [ "$budget" -lt "$min" ]; then
        note "skip $name: ${budget}s left, it needs ${min}s"
        printf '{"step": "%s", "ok": false, "skipped": "deadline: %ss left"}\n' \
            "$name" "$budget" >"$file"
        merge; return
    fi
    note "start $name (${budget}s left)"
    timeout -k 15 "$budget" "$@" --json "$file" --timeout $((budget - 15)) >>"$LOG" 2>&1
    local rc=$?
    [ -f "$file" ] || printf '{"step": "%s", "ok": false, "error": "exit %s, no record"}\n' \
        "$name" "$rc" >"$file"
    note "end $name rc=$rc"
    merge
}
specs() {
    N=$((N + 1))
    local file; file="$RESULTS/$(printf %02d $N)-specs.json"
    note "start specs $1"
    timeout -k 15 "$(left)" "$PY" bench/h200/make_specs.py --work "$WORK" --configs "$1" \
        --device "$BENCH_DEVICE" $TINYFLAG --json "$file" >>"$LOG" 2>&1
    note "end specs rc=$?"
    [ -f "$file" ] || echo '{"step": "specs", "ok": false, "error": "no record"}' >"$file"
    merge
}
tune() {  # tune CONFIG STRATEGIES
    local s
    for s in ${2//,/ }; do
        run "tune-$1-$s" 60 "$PY" bench/h200/steps.py tune --work "$WORK" --tag "$TAG" \
            --config "$1" --strategy "$s"
    done
}
aa() { run "aa-$1" 90 "$PY" bench/h200/steps.py aa --work "$WORK" --tag "$TAG" --config "$1" --reps "$2"; }
release() { run "release-$1" 90 "$PY" bench/h200/steps.py release --work "$WORK" --tag "$TAG" --config "$1" --reps "$2"; }
calib() { run "calib-$1" 90 "$PY" bench/h200/steps.py calib --work "$WORK" --tag "$TAG" --config "$1" --reps "$2"; }
serve() { run "serve-$1" 60 "$PY" bench/h200/steps.py serve --run "$WORK/runs/$TAG/$1" --out "$OUT"; }
bundle() { run "bundle-$1" 60 "$PY" bench/h200/steps.py bundle --run "$WORK/runs/$TAG/$1" --out "$OUT"; }
eager() { run eager 60 "$PY" bench/h200/steps.py eager --work "$WORK" --tag "$TAG" --configs "$1"; }

note "tag $TAG, work $WORK, device $BENCH_DEVICE, deadline ${DEADLINE_S}s"
"$PY" bench/h200/steps.py env --json "$RESULTS/00-env.json" >>"$LOG" 2>&1
merge
[ $# -gt 0 ] || set -- setup
for step in "$@"; do
    case "$step" in
        setup) ;;
        specs) specs "$ALL" ;;
        specs=*) specs "${step#specs=}" ;;
        eager) eager "$ALL" ;;
        eager=*) eager "${step#eager=}" ;;
        tune=*:*) x=${step#tune=}; tune "${x%%:*}" "${x#*:}" ;;
        aa=*:*) x=${step#aa=}; aa "${x%%:*}" "${x#*:}" ;;
        calib=*:*) x=${step#calib=}; calib "${x%%:*}" "${x#*:}" ;;
        release=*:*) x=${step#release=}; release "${x%%:*}" "${x#*:}" ;;
        bundle=*) bundle "${step#bundle=}" ;;
        serve=*) serve "${step#serve=}" ;;
        gpu1) specs "$ALL"; eager resnet50_b1,bert_b1,resnet50_b32,bert_b32; tune resnet50_b1 fast ;;
        gpu2) tune resnet50_b1 full; aa resnet50_b1 10 ;;
        gpu3) tune bert_b1 fast; tune resnet50_b32 fast; tune bert_b32 fast ;;
        gpu4a) specs resnet50_b32,bert_b32,resnet50_b1; tune resnet50_b32 fast; tune bert_b32 fast ;;
        gpu4b) specs resnet50_b1; aa resnet50_b1 4; tune resnet50_b1 fast; bundle resnet50_b1-fast
               calib resnet50_b1 6 ;;
        gpu5a) specs resnet50_b1; calib resnet50_b1 8 ;;
        gpu5b) specs resnet50_b1; aa resnet50_b1 3; tune resnet50_b1 fast; bundle resnet50_b1-fast
               calib resnet50_b1 6 ;;
        gpu5c) specs resnet50_b32,bert_b32; tune resnet50_b32 fast; tune bert_b32 fast ;;
        gpu6a) specs resnet50_b1; calib resnet50_b1 8 ;;
        gpu6b) specs resnet50_b1; tune resnet50_b1 fast; bundle resnet50_b1-fast
               tune resnet50_b1 mixed ;;
        gpu6c) specs resnet50_b32,bert_b32; eager resnet50_b32,bert_b32 ;;
        plan1) specs "$ALL"; eager "$ALL"; tune resnet50_b32 full ;;
        plan2) tune resnet50_b32 fast,mixed; aa resnet50_b1 10 ;;
        plan3) tune bert_b32 full,fast,mixed ;;
        gpu7a) specs resnet50_b1,bert_b1; calib resnet50_b1 10 ;;
        gpu7b) calib bert_b1 5; aa resnet50_b1 10 ;;
        smoke) specs tiny_mlp_b8; eager tiny_mlp_b8; tune tiny_mlp_b8 fast; aa tiny_mlp_b8 2; release tiny_mlp_b8 1
               calib tiny_mlp_b8 2 ;;
        *) note "unknown step $step"; echo "{\"step\": \"$step\", \"ok\": false, \"error\": \"unknown step\"}" \
               >"$RESULTS/$(printf %02d $((N += 1)))-unknown.json"; merge ;;
    esac
done
note "done in $(( $(date +%s) - START ))s; results in $OUT"
