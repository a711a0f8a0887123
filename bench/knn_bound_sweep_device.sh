#!/bin/bash
# One device call, results under $OUT/knn; the cubins come compiled (CAKE_CACHE_DIR carried:
# `python bench/lib_grid.py compile --op knn --arch sm_90a --only "$(cat bench/knn_sweep16_shapes.txt)"
# --variants "_s(16|32|64|128|256)_"` and `python bench/topk_queue_ab.py --option share --compile-only
# --arch sm_90a` on the CPU machine):
#   1. bench/topk_queue_ab.py --option share: the bound off / on (the cached read) at the table's split
#      picks, same run (-> $OUT/knn/ab-share.json);
#   2. the sweep of the split variants (s16 - s256, the new ones among them) at the 34 training shapes of
#      bench/knn_sweep16_shapes.txt, joined with the committed sweep, table refitted (-> $OUT/knn/sweep/).
#     OUT=/some/dir bash bench/knn_bound_sweep_device.sh [SWEEP_BUDGET_S=300]
. "$(dirname "$0")/device_env.sh"
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
timeout 150 $PY bench/topk_queue_ab.py --option share --out $D/ab-share.json --deadline-s 90 > $D/ab.log 2>&1
stamp "ab rc=$?"
tail -26 $D/ab.log
timeout $(( ${1:-300} + 150 )) $PY bench/lib_grid.py sweep --op knn --out $D/sweep --procs $NP --budget-s ${1:-300} \
  --only "$(cat bench/knn_sweep16_shapes.txt)" --variants "_s(16|32|64|128|256)_" \
  --prior bench/results/lib-sweep-knn-h200.json > $D/sweep.log 2>&1
stamp "sweep rc=$?"
grep -E "compiled|probe|budget|table|WARNING" $D/sweep.log | head -12
stamp done
