# Sourced by the device scripts (bench/knn_*_device.sh): strict unset variables, the start time and a
# `stamp` that prefixes seconds since it, unbuffered Python with the cubin cache in CAKE_CACHE_DIR, PY,
# NP (compile processes: all cores but two) and D=$OUT/knn (created).
set -u
T0=$(date +%s)
export PYTHONUNBUFFERED=1 CAKE_CACHE_DIR=${CAKE_CACHE_DIR:-/tmp/cake}
PY=${PYTHON:-python3}
NP=$(( $(nproc) > 3 ? $(nproc) - 2 : 1 ))
D=$OUT/knn; mkdir -p $D
stamp() { echo "[$(( $(date +%s) - T0 )) s] $*"; }
# knn_grid DEADLINE_S SLACK_S: the kNN grid (every 5th shape first) with the committed tables -> $D,
# cut at DEADLINE_S, killed SLACK_S later; its summary last
knn_grid() {
  timeout $(( $1 + $2 )) $PY bench/lib_grid.py grid --op knn --out $D --procs $NP --deadline-s $1 --spread 5 \
    > $D/grid.log 2>&1
  stamp "grid rc=$?"
  grep -E "compiled|deadline" $D/grid.log | head -4
  tail -3 $D/grid.log
}
# gpu_tests TIMEOUT_S PYTEST_ARGS...: the GPU-marked tests named -> $D/pytest.log, its summary stamped
gpu_tests() {
  local t=$1; shift
  timeout $t $PY -m pytest -q -x -p no:cacheprovider -m gpu "$@" > $D/pytest.log 2>&1
  stamp "pytest rc=$?: $(tail -1 $D/pytest.log)"
  grep -E "^FAILED|Error" $D/pytest.log | head -5
}
# kmeans_sweep BUDGET_S ONLY PAT: `lib_grid.py sweep --op kmeans` of those training shapes and variants, joined
# with the committed sweep (--prior) -> $D/kmeans-sweep/ (its log $D/kmeans-sweep.log, the timings printed)
kmeans_sweep() {
  timeout $(( $1 + 120 )) $PY bench/lib_grid.py sweep --op kmeans --out $D/kmeans-sweep --procs $NP \
    --budget-s $1 --only "$2" --variants "$3" --prior bench/results/lib-sweep-kmeans-h200.json > $D/kmeans-sweep.log 2>&1
  stamp "kmeans sweep rc=$?"
  grep -E "compiled|probe|budget" $D/kmeans-sweep.log | head -4
  grep -E "^kmeans \{" $D/kmeans-sweep.log | cut -c1-130
}
# regrid_changed OP DEADLINE_S [TABLE]: the grid shapes whose pick the refitted table TABLE (default
# $D/sweep/OP.json) changes (lib_grid.py changed, listed in $D/changed.txt), re-timed with it (-> $D/grid/; the
# table is copied over cakelib/tables/OP.json), cut at DEADLINE_S; to merge over a full grid with
# `lib_grid.py merge --later-wins`
regrid_changed() {
  local op=$1 new=${3:-$D/sweep/$1.json} only
  only=$($PY bench/lib_grid.py changed $op cakelib/tables/$op.json $new)
  echo "$only" > $D/changed.txt
  stamp "grid shapes whose pick changed: $(echo "$only" | tr ';' '\n' | grep -c =)"
  cp $new cakelib/tables/$op.json
  [ -n "$only" ] && timeout $(( $2 + 60 )) $PY bench/lib_grid.py grid --op $op --out $D/grid --procs $NP \
    --deadline-s $2 --only "$only" > $D/grid.log 2>&1
  stamp "grid rc=$?"
}
