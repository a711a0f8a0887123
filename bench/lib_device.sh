#!/bin/bash
# One device call on a 2-GPU machine: GPU 0 sweeps the kmeans variants, fits its table and times the
# kmeans grid with it; GPU 1 times the knn grid with the committed knn table. Results under $OUT.
#   bash bench/lib_device.sh [kmeans_deadline_s] [knn_deadline_s]
set -u
export PYTHONUNBUFFERED=1 CAKE_CACHE_DIR=${CAKE_CACHE_DIR:-/tmp/cake}
KD=${1:-330}; ND=${2:-420}
mkdir -p $OUT/kmeans $OUT/knn
(export CUDA_VISIBLE_DEVICES=0
 timeout 150 python3 bench/lib_grid.py sweep --op kmeans --out $OUT/kmeans --procs 14 --budget-s 110 > $OUT/kmeans/sweep.log 2>&1
 CAKELIB_TABLES=$OUT/kmeans timeout $((KD + 40)) python3 bench/lib_grid.py grid --op kmeans --out $OUT/kmeans --procs 14 \
   --deadline-s $KD > $OUT/kmeans/grid.log 2>&1) &
(export CUDA_VISIBLE_DEVICES=1
 timeout $((ND + 60)) python3 bench/lib_grid.py grid --op knn --out $OUT/knn --procs 14 --deadline-s $ND > $OUT/knn/grid.log 2>&1) &
wait
grep -E "compiled|table|budget|deadline" $OUT/kmeans/sweep.log $OUT/kmeans/grid.log $OUT/knn/grid.log
tail -3 $OUT/kmeans/grid.log; tail -3 $OUT/knn/grid.log
