#!/bin/bash
# The wide k-means forms (bench/kmeans_wide_sweep.py) and then the large-k kNN timing (bench/knn_topk_device.sh)
# on one H200, results under $OUT (~500 s wall):
#     OUT=/some/dir bash bench/kmeans_wide_sweep_device.sh [SWEEP_S=260]
set -u
T0=$(date +%s)
SWEEP=${1:-260}
export PYTHONUNBUFFERED=1 CAKE_CACHE_DIR=${CAKE_CACHE_DIR:-/tmp/cake}
PY=${PYTHON:-python3}
NP=$(( $(nproc) > 3 ? $(nproc) - 2 : 1 ))
K=$OUT/kmeans_wide; mkdir -p $K
stamp() { echo "[$(( $(date +%s) - T0 )) s] $*"; }
timeout 90 $PY bench/kmeans_wide_sweep.py precompile --procs $NP > $K/precompile.log 2>&1
stamp "precompile rc=$?: $(tail -1 $K/precompile.log)"
grep -v ": ok$" $K/precompile.log | head -5
timeout 60 $PY -m pytest -q -x -p no:cacheprovider -m gpu tests/test_kmeans_wide.py > $K/pytest.log 2>&1
stamp "gpu tests rc=$?: $(tail -1 $K/pytest.log)"
grep -E "^FAILED|Error" $K/pytest.log | head -5
timeout $(( SWEEP + 30 )) $PY bench/kmeans_wide_sweep.py sweep --out $K/sweep.json --deadline-s $SWEEP > $K/sweep.log 2>&1
stamp "sweep rc=$?"
bash bench/knn_topk_device.sh > $OUT/knn-topk.log 2>&1
stamp "knn topk rc=$?"
grep -E "^\[|geomean|Q=|^ *[0-9]" $OUT/knn-topk.log | tail -30
grep -E "^\(" $K/sweep.log
