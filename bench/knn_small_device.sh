#!/bin/bash
# The kNN small-database region (M < 16384) on one GPU: sweep every kNN variant at the region's training
# shapes and fit its table (tables/knn_small.json), then time the library with that table against the
# baselines at the region's evaluation shapes, none of which the fit saw (bench/lib_grid.py knn_small_grid).
#   OUT=DIR bash bench/knn_small_device.sh [sweep_budget_s] [grid_deadline_s]
# Writes $OUT/small/{knn_small.json,lib-sweep-h200.json}, $OUT/small-grid/lib-grid-knn-h200.json; prints the
# grid's summary last. Copy $OUT/small/knn_small.json to cakelib/tables/ to adopt the fit.
set -u
export PYTHONUNBUFFERED=1 CAKE_CACHE_DIR=${CAKE_CACHE_DIR:-/tmp/cake}
SWEEP=${1:-150}
GRID=${2:-60}
mkdir -p $OUT/small $OUT/small-grid $OUT/tables
python3 bench/lib_grid.py sweep --op knn --region small --budget-s $SWEEP --out $OUT/small > $OUT/small-sweep.log 2>&1
echo "sweep rc=$? $(grep -E 'table ->' $OUT/small-sweep.log)"
cp -r cakelib/tables/* $OUT/tables/ && cp $OUT/small/knn_small.json $OUT/tables/ 2>/dev/null
CAKELIB_TABLES=$OUT/tables python3 bench/lib_grid.py grid --op knn --region small --deadline-s $GRID \
  --out $OUT/small-grid > $OUT/small-grid.log 2>&1
echo "grid rc=$?"
grep -E "BAD|Error|Traceback" $OUT/small-sweep.log | head -5
tail -25 $OUT/small-grid.log
python3 bench/lib_grid.py summary $OUT/small-grid/lib-grid-knn-h200.json
