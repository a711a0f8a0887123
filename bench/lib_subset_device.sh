#!/bin/bash
# One short device call: time new variants on a subset of the training shapes, refit the table with the
# committed sweep's measurements (--prior), then time the grid's shapes of that subset with the refitted
# table next to the baselines; results under $OUT/$OP.
#     OUT=/some/dir bash bench/lib_subset_device.sh OP ONLY VARIANTS_REGEX [GRID_DEADLINE_S=100]
# e.g. bench/lib_subset_device.sh knn k=16 '_b2_mw_wg|_b4_mw_ws4'
set -u
T0=$(date +%s)
OP=$1 ONLY=$2 PAT=$3 GD=${4:-100}
export PYTHONUNBUFFERED=1 CAKE_CACHE_DIR=${CAKE_CACHE_DIR:-/tmp/cake}
PY=${PYTHON:-python3}
NP=$(( $(nproc) > 3 ? $(nproc) - 2 : 1 ))
D=$OUT/$OP; mkdir -p $D
stamp() { echo "[$(( $(date +%s) - T0 )) s] $*"; }
$PY bench/lib_grid.py sweep --op $OP --out $D --procs $NP --budget-s 60 --only "$ONLY" --variants "$PAT" \
  --prior bench/results/lib-sweep-$OP-h200.json > $D/sweep.log 2>&1
stamp "sweep rc=$?: $(grep -E 'probed|table ->' $D/sweep.log | tr '\n' ' ')"
grep -E "BAD|left out" $D/sweep.log | head -5
grep -E "^$OP \{" $D/sweep.log
[ -f $D/$OP.json ] && TABLES=$D || TABLES=cakelib/tables
CAKELIB_TABLES=$TABLES timeout $(( GD + 60 )) $PY bench/lib_grid.py grid --op $OP --out $D --procs $NP --only "$ONLY" \
  --deadline-s $GD > $D/grid.log 2>&1
stamp "grid rc=$? (tables $TABLES): $(grep -E 'compiled|deadline' $D/grid.log | tr '\n' ' ')"
grep "ok=False" $D/grid.log | head -3
F=$D/lib-grid-$OP-h200.json; [ -f $F ] || F=$D/lib-grid-$OP-h200.partial.json
if [ -f $F ]; then
  $PY bench/lib_grid.py compare bench/results/lib-grid-$OP-h200.json $F
  $PY bench/lib_grid.py summary $F
fi
stamp done
