#!/bin/bash
# One device call after bench/knn_profile_device.sh, results under $OUT/knn, all timed with the blocking kernel
# (bench/examples.py `timed`: GPU time, the host's launch path hidden):
#   1. a third queue A/B at the few-query split streams (ws4) -> ab3.json; the queue table refitted
#      from the three runs (ab3 re-measures its (variant, k)s);
#   2. the knn grid with that table, baselines in the same run (deadline GRID_DEADLINE_S);
#   3. the host-side cost of small calls (bench/knn_host_overhead.py, with choose()'s cache).
#     OUT=/some/dir bash bench/knn_final_device.sh [GRID_DEADLINE_S=290]
. "$(dirname "$0")/device_env.sh"
M1=1048576
SHAPES="[{\"Q\":1,\"M\":$M1,\"k\":10},{\"Q\":4,\"M\":262144,\"k\":10},{\"Q\":16,\"M\":$M1,\"k\":10},\
{\"Q\":2,\"M\":262144,\"k\":16},{\"Q\":8,\"M\":$M1,\"k\":16},{\"Q\":4,\"M\":4194304,\"k\":16},\
{\"Q\":2,\"M\":100000,\"k\":10},{\"Q\":16,\"M\":100000,\"k\":10},{\"Q\":4,\"M\":100000,\"k\":16},\
{\"Q\":32,\"M\":100000,\"k\":16},{\"Q\":1,\"M\":$M1,\"k\":32}]"
timeout 200 $PY bench/topk_queue_ab.py --out $D/ab3.json --queues 0,2 --shapes "$SHAPES" --deadline-s 120 \
  --procs $NP > $D/ab3.log 2>&1
stamp "ab3 rc=$?"; tail -12 $D/ab3.log
$PY bench/topk_queue_ab.py --fit bench/results/topk-queue-ab-h200.json bench/results/topk-queue-ab2-h200.json \
  $D/ab3.json > $D/fit.log 2>&1
cp cakelib/tables/topk_queue/knn.json $D/queue-table.json
stamp "fit: $(tr -d ' \n' < $D/fit.log | head -c 900)"
timeout $(( ${1:-290} + 150 )) $PY bench/lib_grid.py grid --op knn --out $D --procs $NP --deadline-s ${1:-290} \
  --spread 5 > $D/grid.log 2>&1
stamp "grid rc=$?"; tail -5 $D/grid.log
timeout 60 $PY bench/knn_host_overhead.py --out $D/host.json --calls 200 > $D/host.log 2>&1
stamp "host rc=$?"; tail -10 $D/host.log
