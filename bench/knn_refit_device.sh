#!/bin/bash
# One device call: the few-query training shapes the first refit left to stale rows
# (M = 4M at k = 10, Q = 32), swept over the stream variants and joined with the committed sweep
# (table refitted), then the grid shapes whose pick the refit changed, re-timed (-> $OUT/knn/grid/).
# The cubins come compiled (CAKE_CACHE_DIR carried).
#     OUT=/some/dir bash bench/knn_refit_device.sh
. "$(dirname "$0")/device_env.sh"
PAT='(_ws4|bq16_bn32_s128_p4_gn_mw$|bq64_bn128_s128_p3_mw_wg|bq64_bn64_s128_p4_mw_wg_ov|bq64_bn64_s256)'
timeout 150 $PY bench/lib_grid.py sweep --op knn --out $D/sweep --procs $NP --budget-s 90 \
  --only "$(cat bench/knn_sweep16b_shapes.txt)" --variants "$PAT" \
  --prior bench/results/lib-sweep-knn-h200.json > $D/sweep.log 2>&1
stamp "sweep rc=$?"
grep -E "compiled|probe|budget|table" $D/sweep.log | head -6
ONLY=$($PY bench/lib_grid.py changed knn cakelib/tables/knn.json $D/sweep/knn.json)
echo "$ONLY" > $D/changed.txt
stamp "grid shapes whose pick changed: $(echo "$ONLY" | tr ';' '\n' | grep -c Q)"
cp $D/sweep/knn.json cakelib/tables/knn.json
[ -n "$ONLY" ] && timeout 200 $PY bench/lib_grid.py grid --op knn --out $D/grid --procs $NP --deadline-s 150 \
  --only "$ONLY" > $D/grid.log 2>&1
stamp "grid rc=$?"
tail -2 $D/grid.log
stamp done
