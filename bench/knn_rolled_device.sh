#!/bin/bash
# One device call: the rolled insertion (`topk` rolled: one loop per row over its passing scores,
# the search loop's code ~4.5x smaller) -> $OUT/knn:
#   1. its GPU tests (tests/test_topk_rolled.py, against float64);
#   2. a same-run A/B, rolled 0 / 1, at the table's picks on 24 shapes across the grid's k > 1 regimes
#      (bench/results/logs/session22/rolled-ab-shapes.json) -> $D/rolled-ab.json.
# Compile first on the CPU machine and carry the cache:
#     CAKE_CACHE_DIR=DIR python bench/topk_queue_ab.py --option rolled --values 0,1 \
#       --shapes "$(cat bench/results/logs/session22/rolled-ab-shapes.json)" --compile-only --arch sm_90a
#     OUT=/some/dir CAKE_CACHE_DIR=DIR bash bench/knn_rolled_device.sh [AB_DEADLINE_S=200]
. "$(dirname "$0")/device_env.sh"
gpu_tests 150 tests/test_topk_rolled.py
timeout $(( ${1:-200} + 60 )) $PY bench/topk_queue_ab.py --option rolled --values 0,1 \
  --shapes "$(cat bench/results/logs/session22/rolled-ab-shapes.json)" --out $D/rolled-ab.json --procs $NP \
  --deadline-s ${1:-200} > $D/ab.log 2>&1
stamp "ab rc=$?"
tail -30 $D/ab.log
