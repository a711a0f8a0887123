#!/bin/bash
# One device call after bench/knn_queue_device.sh, results under $OUT/knn:
#   1. a second queue A/B at the (variant, k) picks of the grid the first one did not measure (k = 10
#      mostly; T = 0 / 2 / 4) -> $OUT/knn/ab2.json;
#   2. the queue table refitted from both A/B runs (cakelib/tables/topk_queue/knn.json, copied to $OUT);
#   3. the knn grid with that table, baselines in the same run (deadline GRID_DEADLINE_S).
#     OUT=/some/dir bash bench/knn_queue_grid_device.sh [GRID_DEADLINE_S=300]
. "$(dirname "$0")/device_env.sh"
M1=1048576
SHAPES="[{\"Q\":2,\"M\":$M1,\"k\":10},{\"Q\":32,\"M\":$M1,\"k\":10},{\"Q\":8,\"M\":100000,\"k\":16},\
{\"Q\":8,\"M\":100000,\"k\":10},{\"Q\":128,\"M\":$M1,\"k\":10},{\"Q\":256,\"M\":262144,\"k\":10},\
{\"Q\":512,\"M\":$M1,\"k\":10},{\"Q\":4096,\"M\":262144,\"k\":10},{\"Q\":10000,\"M\":$M1,\"k\":32}]"
timeout 200 $PY bench/topk_queue_ab.py --out $D/ab2.json --queues 0,2,4 --shapes "$SHAPES" --deadline-s 150 \
  --procs $NP > $D/ab2.log 2>&1
stamp "ab2 rc=$?"; tail -11 $D/ab2.log
$PY bench/topk_queue_ab.py --fit bench/results/topk-queue-ab-h200.json $D/ab2.json > $D/fit.log 2>&1
cp cakelib/tables/topk_queue/knn.json $D/queue-table.json
stamp "fit: $(tr -d ' \n' < $D/fit.log | head -c 900)"
timeout $(( ${1:-300} + 150 )) $PY bench/lib_grid.py grid --op knn --out $D --procs $NP --deadline-s ${1:-300} --spread 5 \
  > $D/grid.log 2>&1
stamp "grid rc=$?"; tail -6 $D/grid.log
stamp done
