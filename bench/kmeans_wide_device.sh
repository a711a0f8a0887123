#!/bin/bash
# The wide k-means family on one GPU (H100 / H200) (200 s wall by default, deadline-guarded), results under $OUT/kmeans_wide:
#   1. precompile the family's kernels for every benchmarked D (NVRTC, in parallel, into $CAKE_CACHE_DIR);
#   2. correctness: the GPU-marked tests of tests/test_kmeans_wide.py (float64 numpy Lloyd reference; TESTS_K: a
#      pytest -k selection of them) in a child;
#   3. per shape (20 training + 5 held-out): one checked iteration (float64 on the GPU), then 10 Lloyd
#      iterations from the same centroids timed for cakelib, flashlib, flash-kmeans and torch (tol=-1); rows
#      appended to rows.jsonl as they finish; a faulting run is resumed without cakelib on the shape it crashed;
#   4. kmeans-wide.json (GPU, versions, command, rows) and the table, printed last.
#     OUT=/some/dir bash bench/kmeans_wide_device.sh [TOTAL_S=200]
set -u
T0=$(date +%s)
TOTAL=${1:-200}
export PYTHONUNBUFFERED=1 CAKE_CACHE_DIR=${CAKE_CACHE_DIR:-/tmp/cake}
PY=${PYTHON:-python3}
NP=$(( $(nproc) > 3 ? $(nproc) - 2 : 1 ))
D=$OUT/kmeans_wide; mkdir -p $D
left() { echo $(( TOTAL - ($(date +%s) - T0) )); }
stamp() { echo "[$(( $(date +%s) - T0 )) s] $*"; }

timeout 150 $PY bench/kmeans_wide_bench.py precompile --procs $NP > $D/precompile.log 2>&1
stamp "precompile rc=$?: $(tail -1 $D/precompile.log)"
grep "^compile" $D/precompile.log | head -3

timeout 120 $PY -m pytest -q -p no:cacheprovider -m gpu tests/test_kmeans_wide.py ${TESTS_K:+-k "$TESTS_K"} \
  > $D/pytest.log 2>&1
stamp "gpu tests rc=$?: $(tail -1 $D/pytest.log)"
grep -E "^FAILED|Error" $D/pytest.log | head -5

for attempt in 1 2 3; do
  L=$(left); [ $L -lt 30 ] && break
  RES=""; [ $attempt -gt 1 ] && RES=--resume
  timeout $(( L - 12 )) $PY bench/kmeans_wide_bench.py bench --out $D --deadline-s $(( L - 30 )) $RES >> $D/bench.log 2>&1
  rc=$?
  stamp "bench attempt $attempt rc=$rc: $(grep -c . $D/rows.jsonl 2>/dev/null || echo 0) rows"
  [ $rc -eq 0 ] && break
  tail -3 $D/bench.log
done
timeout 20 $PY bench/kmeans_wide_bench.py summary --out $D 2>&1 | tee $D/summary.txt
stamp "done"
