#!/bin/bash
# One device call: the grids only, with the committed dispatch tables (cakelib/tables), results under
# $OUT/<op>; no sweep. For completing a grid a previous call's deadline cut (KMEANS_SKIP: the shapes of
# the spread order already timed) and re-timing a grid after a refit of its table from committed sweeps.
#     OUT=/some/dir bash bench/lib_grids_device.sh [KNN_DEADLINE_S=290] [KMEANS_DEADLINE_S=220] [KMEANS_SKIP=0]
set -u
T0=$(date +%s)
export PYTHONUNBUFFERED=1 CAKE_CACHE_DIR=${CAKE_CACHE_DIR:-/tmp/cake} CAKELIB_TABLES=cakelib/tables
PY=${PYTHON:-python3}
NP=$(( $(nproc) > 3 ? $(nproc) - 2 : 1 ))
stamp() { echo "[$(( $(date +%s) - T0 )) s] $*"; }
mkdir -p $OUT/knn $OUT/kmeans
timeout $(( ${1:-290} + 40 )) $PY bench/lib_grid.py grid --op knn --out $OUT/knn --procs $NP --deadline-s ${1:-290} \
  --spread 5 > $OUT/knn/grid.log 2>&1
stamp "knn grid rc=$?: $(grep -E 'compiled|deadline' $OUT/knn/grid.log | tr '\n' ' ')"
timeout $(( ${2:-220} + 40 )) $PY bench/lib_grid.py grid --op kmeans --out $OUT/kmeans --procs $NP \
  --deadline-s ${2:-220} --spread 5 --skip ${3:-0} > $OUT/kmeans/grid.log 2>&1
stamp "kmeans grid rc=$?: $(grep -E 'compiled|deadline' $OUT/kmeans/grid.log | tr '\n' ' ')"
for op in knn kmeans; do
  F=$OUT/$op/lib-grid-$op-h200.json; [ -f $F ] || F=$OUT/$op/lib-grid-$op-h200.partial.json
  grep -h "ok=False" $OUT/$op/grid.log | head -3
  [ -f $F ] && $PY bench/lib_grid.py summary $F
done
stamp done
