#!/bin/bash
# The large-k kNN (k up to 1024, any D) on one H200, results under $OUT/knn (TOTAL_S wall, default 175 s):
#   1. NVRTC builds of every kernel the phases launch (parallel, CPU);
#   2. correctness against float64 at small shapes (k in {33, 100, 1024} x D in {64, 100, 768}, l2 and ip; the
#      D % 64 == 0 shapes with both distance tiles: the timing uses wgmma only where it passed)
#      and the GPU tests of tests/test_knn_large_k.py;
#   3. timing beside flashlib flash_knn and torch (chunked matmul + topk) on the main grid (19 shapes), then
#      5 held-out shapes (k = 50 / 200 / 500, D = 96 / 384, one ip), each phase cut at its deadline (cheapest
#      shapes first; MIN_Q=1000 times only the shapes with Q >= 1000, which a full run's deadline cuts);
#   4. the table (bench/knn_topk_table.py).
# Each phase is its own process (a kernel fault loses that phase's later rows only).
#     OUT=/some/dir [TOTAL_S=175] [MIN_Q=0] bash bench/knn_topk_device.sh
. "$(dirname "$0")/device_env.sh"
TOTAL=${TOTAL_S:-175}
MINQ="--min-q ${MIN_Q:-0}"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
timeout 60 $PY bench/knn_topk_bench.py compile > $D/compile.log 2>&1; stamp "compile rc=$?: $(tail -1 $D/compile.log)"
timeout 55 $PY bench/knn_topk_bench.py check $D/topk-check.json > $D/check.log 2>&1
stamp "check rc=$?: $(grep -c -- '-> True' $D/check.log) passed, $(grep -c -- '-> False' $D/check.log) failed"
grep -- "-> False" $D/check.log | head -5
left=$(( TOTAL - $(date +%s) + T0 ))
main=$(( left * 3 / 4 ))    # the main grid's share; the held-out shapes get the rest
timeout $(( main > 10 ? main : 5 )) $PY bench/knn_topk_bench.py time $D/topk-main.json $MINQ --check $D/topk-check.json \
  --deadline-s $(( main > 30 ? main - 25 : 1 )) > $D/time.log 2>&1
stamp "time rc=$?"
left=$(( TOTAL - $(date +%s) + T0 ))
timeout $(( left > 10 ? left - 5 : 1 )) $PY bench/knn_topk_bench.py time $D/topk-held.json --held $MINQ --check $D/topk-check.json \
  --deadline-s $(( left > 25 ? left - 25 : 1 )) > $D/held.log 2>&1
stamp "held rc=$?"
left=$(( TOTAL + 3 - $(date +%s) + T0 ))
[ $left -gt 20 ] && gpu_tests $(( left - 5 )) tests/test_knn_large_k.py
$PY bench/knn_topk_table.py $D/topk-check.json $D/topk-main.json $D/topk-held.json
stamp done
