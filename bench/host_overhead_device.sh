#!/bin/bash
# Host overhead per small cakelib call on one GPU (budget 90 s wall): correctness of every cakelib form
# against float64 first (its own process: a fault there cannot take the timing down), then host / GPU /
# end-to-end time per call of cakelib.knn / kmeans (planned, out=, general path) and flashlib side by side.
# Results: $OUT/host-check.json, $OUT/host-overhead.json; the table prints last.
#   bash bench/host_overhead_device.sh
set -u
export PYTHONUNBUFFERED=1 CAKE_CACHE_DIR=${CAKE_CACHE_DIR:-/tmp/cake}
PY=${PYTHON:-python3}
T0=$(date +%s)
stamp() { echo "[$(( $(date +%s) - T0 )) s] $*"; }
timeout 35 $PY bench/knn_host_overhead.py check --out $OUT/host-check.json > $OUT/host-check.log 2>&1
stamp "check rc=$?"
grep -E "^check|Error" $OUT/host-check.log | cut -c1-300 | head -12
LEFT=$(( 84 - ($(date +%s) - T0) ))
timeout $LEFT $PY bench/knn_host_overhead.py time --check $OUT/host-check.json --out $OUT/host-overhead.json \
  --calls 100 --deadline-s $(( LEFT - 14 )) > $OUT/host-overhead.log 2>&1
stamp "time rc=$?"
grep -vE "^\s*$" $OUT/host-overhead.log | tail -48
