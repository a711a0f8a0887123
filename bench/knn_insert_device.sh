#!/bin/bash
# One device call, results under $OUT/knn:
#   1. the k = 32 split-search GPU test; when it passes, KNN_K_MAX_SPLIT is raised to 32 in this copy of
#      the tree so the sweep times the k = 32 split variants (commit the change only if the sweep agrees);
#   2. the other GPU-marked knn tests, while the sweep's kernels compile in the background;
#   3. bench/topk_insert_ab.py: the shift insertion vs the previous bubble, same run (-> $OUT/knn/ab.json);
#   4. the knn sweep (budget SWEEP_BUDGET_S) -> $OUT/knn/knn.json and lib-sweep-knn-h200.json.
#     OUT=/some/dir bash bench/knn_insert_device.sh [SWEEP_BUDGET_S=220] [AB_DEADLINE_S=110]
. "$(dirname "$0")/device_env.sh"
timeout 90 $PY -m pytest -q -p no:cacheprovider -m gpu tests/test_knn_fast.py -k k32_passes > $D/k32.log 2>&1
RC=$?
stamp "k32 test rc=$RC: $(tail -1 $D/k32.log)"
if [ $RC -eq 0 ] && grep -q "3 passed" $D/k32.log; then
  sed -i 's/^KNN_K_MAX_SPLIT = 16/KNN_K_MAX_SPLIT = 32/' cakelib/variants.py
fi
grep -n "^KNN_K_MAX_SPLIT" cakelib/variants.py
timeout 150 $PY bench/lib_grid.py compile --op knn --procs $(( NP - 1 )) > $D/compile.log 2>&1 &
CPID=$!
timeout 120 $PY -m pytest -q -p no:cacheprovider -m gpu tests/test_knn_fast.py tests/test_topk_wgmma.py \
  -k "not k32_passes" > $D/tests.log 2>&1
stamp "tests rc=$?: $(tail -1 $D/tests.log)"
grep -E "^FAILED|Error" $D/tests.log | head -5
wait $CPID
stamp "precompile: $(tail -1 $D/compile.log)"
timeout $(( ${2:-110} + 40 )) $PY bench/topk_insert_ab.py --out $D/ab.json --deadline-s ${2:-110} > $D/ab.log 2>&1
stamp "ab rc=$?"
timeout $(( ${1:-220} + 60 )) $PY bench/lib_grid.py sweep --op knn --out $D --procs $NP --budget-s ${1:-220} > $D/sweep.log 2>&1
stamp "sweep rc=$?: $(grep -E 'probed|table ->|budget' $D/sweep.log | tr '\n' ' ')"
echo "sweep failures: $(grep -c ' BAD ' $D/sweep.log)"; grep ' BAD ' $D/sweep.log | head -3
tail -13 $D/ab.log
stamp done
