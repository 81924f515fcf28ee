#!/usr/bin/env bash
# The workload suite on a GPU machine: sets up what the machine lacks (wheels from .whl/ when
# pydantic is missing, the checkout installed in place when no backend is registered), then
# bench/suite/suite.py run within DEADLINE_S.
#
# usage: OUT=DIR BENCH_TAG=T [DEADLINE_S=540] [SUITE_MAT=C1,C2] [SUITE_PIN=C3] [SUITE_MODES=...] \
#            bash bench/suite/run.sh CONFIG[,CONFIG...]
# SUITE_MAT: configs that also release max_autotune (served as dossier-mat); SUITE_PIN: configs
# that also release the CUDA-graph route pinned (release-cg.toml, served as dossier-cg; a GPU only)
# SUITE_ONLY_PIN / SUITE_ONLY_BASE: configs released with the CUDA-graph route / the default
# route pinned alone, no fast release (served as dossier-cg / dossier-base); SUITE_TOGETHER=1
# (every config so named): the specs first, the one-route releases at once, then each comparison
# alone (builds sharing the GPU can pick slower kernels: check kernel times; bench/suite/README.md)
# env: BENCH_WORK (bench/work/suite)  BENCH_DEVICE (cuda)  BENCH_TINY (0)  PYTHON (python3)
#      BENCH_BUILD_JOBS (dossier release --build-jobs)  SUITE_ROUNDS (20)
#      SUITE_MA_MIN_S (150: a comparison compiles max-autotune only with this much time left)
#      SUITE_COMPARE_CAP_S (420: the most one comparison is given)
# writes: $OUT/suite-$TAG.json, $OUT/suite-$TAG.log, $OUT/caches-suite-$TAG.tar.gz
set -u
cd "$(dirname "$0")/../.." || exit 2
REPO=$(pwd)
PY=${PYTHON:-python3}
OUT=${OUT:?set OUT to the folder the results go to}
TAG=${BENCH_TAG:-$(date -u +%Y%m%dT%H%M%SZ)}
START=$(date +%s)
mkdir -p "$OUT"
LOG="$OUT/suite-$TAG.log"
mkdir -p "$REPO/bench/work/pkgs" && ln -sfn "$REPO/cli" "$REPO/bench/work/pkgs/dossier_cli"
export PYTHONPATH="$REPO:$REPO/bench/work/pkgs${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
WHEELS=${BENCH_WHEELS:-$( [ -d .whl ] && echo .whl || echo ../.whl )}
if ! "$PY" -c "import pydantic" 2>/dev/null && ls "$WHEELS"/*.whl >/dev/null 2>&1; then
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/site "$WHEELS"/*.whl >>"$LOG" 2>&1
    export PYTHONPATH="/tmp/site:$PYTHONPATH"
fi
if ! "$PY" -c "import importlib.metadata as m, sys; sys.exit(0 if m.entry_points(group='dossier.backends') else 1)" 2>/dev/null; then
    "$PY" -m pip install -q --no-deps --no-index --no-build-isolation -e "$REPO" >>"$LOG" 2>&1
fi
TINY=(); [ "${BENCH_TINY:-0}" = 1 ] && TINY=(--tiny)
TOGETHER=(); [ "${SUITE_TOGETHER:-0}" = 1 ] && TOGETHER=(--together)
"$PY" bench/suite/suite.py run --configs "${1:?name the configs}" --out "$OUT" --tag "$TAG" \
    --work "${BENCH_WORK:-$REPO/bench/work/suite}" --device "${BENCH_DEVICE:-cuda}" \
    --deadline $(( ${DEADLINE_S:-540} - ($(date +%s) - START) )) --mat "${SUITE_MAT:-}" \
    --pin "${SUITE_PIN:-}" --only-pin "${SUITE_ONLY_PIN:-}" --only-base "${SUITE_ONLY_BASE:-}" \
    --modes "${SUITE_MODES:-eager,default,reduce-overhead,max-autotune}" \
    --ma-min-s "${SUITE_MA_MIN_S:-150}" --compare-cap-s "${SUITE_COMPARE_CAP_S:-420}" \
    --rounds "${SUITE_ROUNDS:-20}" "${TINY[@]}" "${TOGETHER[@]}"
