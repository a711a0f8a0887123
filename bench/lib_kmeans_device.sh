#!/bin/bash
# One device call (TOTAL seconds wall at most), results under $OUT/kmeans. On a 2-GPU machine (nvidia-h200-x2):
#   GPU 0: `lib_grid.py sweep --op kmeans` (every kmeans variant x training shape, checked and timed; the
#          dispatch table refitted into $OUT/kmeans/kmeans.json), then grid shard 0/2 with that table;
#   GPU 1: the GPU-marked tests of the onehot op and of cakelib's kmeans (the tensor-core update variants,
#          in-place outputs) and knn's in-place outputs, then -- once the table is there -- grid shard 1/2.
# On one GPU the same steps run one after the other (tests, sweep, the whole grid).
# Then the shards are merged into $OUT/kmeans/lib-grid-kmeans-h200.json, compared with the committed grid
# and summarised (printed last).
#     OUT=/some/dir [PROFILE='{variant params}'] bash bench/lib_kmeans_device.sh [TOTAL_S=540] [SWEEP_BUDGET_S=170] [TEST_S=150]
set -u
T0=$(date +%s)
TOTAL=${1:-540}
SB=${2:-170}
TT=${3:-150}
export PYTHONUNBUFFERED=1 CAKE_CACHE_DIR=${CAKE_CACHE_DIR:-/tmp/cake}
PY=${PYTHON:-python3}
NP=$(nproc); NP=$(( NP > 6 ? NP / 2 - 2 : 1 ))
D=$OUT/kmeans
mkdir -p $D/g0 $D/g1
left() { echo $(( TOTAL - ($(date +%s) - T0) )); }
stamp() { echo "[$(( $(date +%s) - T0 )) s] $*"; }
grid_shard() {   # $1: shard index; the deadline leaves room for the dispatched kernels' compile and the merge
  local tables=cakelib/tables; [ -f $D/kmeans.json ] && tables=$D
  local gd=$(( $(left) - 60 )); [ $gd -lt 20 ] && gd=20
  CAKELIB_TABLES=$tables timeout $(( $(left) - 10 )) $PY bench/lib_grid.py grid --op kmeans --out $D/g$1 \
    --procs $NP --deadline-s $gd --spread 5 --shard $1/$NS > $D/grid$1.log 2>&1
  stamp "grid shard $1 rc=$? (tables $tables, deadline $gd s): $(grep -E 'compiled|deadline' $D/grid$1.log | tr '\n' ' ')"
}

run_tests() {
  timeout $TT $PY -m pytest -q -p no:cacheprovider -m gpu tests/test_onehot.py tests/test_cakelib.py \
    tests/test_kmeans_wgmma.py "tests/test_knn_fast.py::test_cakelib_knn_writes_caller_outputs_in_place" \
    -k "onehot or kmeans or in_place" \
    > $D/tests.log 2>&1
  stamp "tests rc=$?: $(tail -1 $D/tests.log)"
}
run_sweep() {
  timeout $(( SB + 60 )) $PY bench/lib_grid.py sweep --op kmeans --out $D --procs $NP --budget-s $SB > $D/sweep.log 2>&1
  stamp "sweep rc=$?: $(grep -E 'table ->|budget|compiled' $D/sweep.log | tr '\n' ' ')"
  touch $D/sweep.done
}
NG=$(nvidia-smi -L 2>/dev/null | wc -l)
if [ "${NG:-1}" -lt 2 ]; then
  NP=$(( $(nproc) > 3 ? $(nproc) - 2 : 1 )); NS=1
  run_tests; run_sweep; grid_shard 0
else
  NS=2
  (export CUDA_VISIBLE_DEVICES=0
   run_sweep
   grid_shard 0) &
  (export CUDA_VISIBLE_DEVICES=1
   run_tests
   # while GPU 0 sweeps: where a tile's time goes in one kernel (Nsight Compute's full set; PROFILE set)
   if command -v ncu >/dev/null && [ -n "${PROFILE:-}" ]; then
     timeout 100 ncu --set full -k regex:kmeans --launch-skip 2 --launch-count 1 $PY bench/profile_lib.py kmeans 1 \
       1048576 256 "$PROFILE" > $D/ncu.txt 2>&1
     stamp "ncu rc=$?"
   fi
   while [ ! -f $D/sweep.done ] && [ $(left) -gt 150 ]; do sleep 3; done
   grid_shard 1) &
  wait
fi

echo "sweep failures: $(grep -c ' BAD ' $D/sweep.log)"; grep ' BAD ' $D/sweep.log | head -5
grep -h "ok=False" $D/grid0.log $D/grid1.log 2>/dev/null | head -3
$PY -c "from cakelib.dispatch import DispatchTable as T; print('table can pick:', sorted(T.load('$D/kmeans.json').reachable()))" 2>/dev/null
F=(); for i in 0 1; do
  f=$D/g$i/lib-grid-kmeans-h200.json; [ -f $f ] || f=$D/g$i/lib-grid-kmeans-h200.partial.json
  [ -f $f ] && F+=($f)
done
if [ ${#F[@]} -gt 0 ]; then
  $PY bench/lib_grid.py merge $D/lib-grid-kmeans-h200.json "${F[@]}" > /dev/null
  $PY bench/lib_grid.py compare bench/results/lib-grid-kmeans-h200.json $D/lib-grid-kmeans-h200.json
  $PY bench/lib_grid.py summary $D/lib-grid-kmeans-h200.json
else
  echo "no grid results"
fi
grep -E "passed|failed" $D/tests.log | tail -2
stamp "done"
