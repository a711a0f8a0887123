#!/bin/bash
# One device call on a 1-GPU slot (the caller sets CUDA_VISIBLE_DEVICES; ~8.5 min wall at most), all
# results under $OUT/knn:
#   1. the GPU-marked tests of the new knn variants (tests/test_knn_fast.py: through the task's evaluator,
#      workspace left zeroed, and through cakelib against float64; tests/test_knn_wgmma.py and
#      test_topk_wgmma.py: the sm_90a wgmma search and its top-k lowering), while the sweep's kernels compile in
#      the background into the cubin cache (the tests' own kernels compile one at a time: ~5 s each; the
#      previous variants are checked against float64 by every sweep and grid measurement anyway);
#   2. `lib_grid.py sweep --op knn`: every knn variant x training shape, checked and timed, the dispatch
#      table refitted into $OUT/knn/knn.json (budget ~150 s);
#   3. `lib_grid.py grid --op knn` with that table (CAKELIB_TABLES=$OUT/knn), shapes spread so a run cut
#      by its deadline still covers the grid; the deadline keeps the whole script under TOTAL seconds;
#   4. the summary (`lib_grid.py summary`) printed last.
#     OUT=/some/dir bash bench/lib_knn_device.sh [TOTAL_S=505] [SWEEP_BUDGET_S=140] [TEST_S=120]
set -u
T0=$(date +%s)
TOTAL=${1:-505}
SB=${2:-140}
TT=${3:-120}
export PYTHONUNBUFFERED=1 CAKE_CACHE_DIR=${CAKE_CACHE_DIR:-/tmp/cake}
PY=${PYTHON:-python3}
NP=$(nproc); NP=$(( NP > 3 ? NP - 2 : 1 ))
D=$OUT/knn
mkdir -p $D
left() { echo $(( TOTAL - ($(date +%s) - T0) )); }
stamp() { echo "[$(( $(date +%s) - T0 )) s] $*"; }

# 1. tests, with the sweep's kernels compiling meanwhile (fills $CAKE_CACHE_DIR; arch of GPU 0)
ARCH=$($PY -c "from gpu_backend.driver import arch_of, properties; print(arch_of(properties(0)))" 2>/dev/null | tail -1)
[ -n "$ARCH" ] || ARCH=sm_90a
timeout $(( TT + 15 )) $PY bench/lib_grid.py compile --op knn --arch $ARCH --procs $(( NP > 2 ? NP - 1 : 1 )) > $D/compile.log 2>&1 &
CPID=$!
timeout $TT $PY -m pytest -q -p no:cacheprovider -m gpu tests/test_knn_fast.py tests/test_knn_wgmma.py \
  tests/test_topk_wgmma.py > $D/tests.log 2>&1
stamp "tests rc=$?: $(tail -1 $D/tests.log)"
wait $CPID
stamp "precompile: $(grep -E 'variant x k' $D/compile.log | tail -1)"

# 2. sweep -> $D/knn.json (its own precompile now hits the cache)
timeout $(( SB + 50 )) $PY bench/lib_grid.py sweep --op knn --out $D --procs $NP --budget-s $SB > $D/sweep.log 2>&1
stamp "sweep rc=$?: $(grep -E 'table ->|budget' $D/sweep.log | tr '\n' ' ')"

# 3. grid with the fitted table (the committed one if the sweep wrote none); the deadline leaves room
#    for compiling the dispatched kernels (~20-40 s), the shape in flight and the summary
[ -f $D/knn.json ] && TABLES=$D || TABLES=cakelib/tables
GD=$(( $(left) - 70 )); [ $GD -lt 20 ] && GD=20
CAKELIB_TABLES=$TABLES timeout $(( $(left) - 8 )) $PY bench/lib_grid.py grid --op knn --out $D --procs $NP \
  --deadline-s $GD --spread 5 > $D/grid.log 2>&1
stamp "grid rc=$? (tables $TABLES, deadline $GD s): $(grep -E 'compiled|deadline' $D/grid.log | tr '\n' ' ')"

# 4. summary (the final file, else the partial one a killed run leaves): failures, the fitted table's
#    picks, new vs the previous H200 grid on the shapes both timed, then the grid summary
F=$D/lib-grid-knn-h200.json; [ -f $F ] || F=$D/lib-grid-knn-h200.partial.json
echo "sweep failures: $(grep -c ' BAD ' $D/sweep.log)"; grep ' BAD ' $D/sweep.log | head -3
grep -E "ok=False" $D/grid.log | head -3
$PY -c "from cakelib.dispatch import DispatchTable as T; print('table can pick:', sorted(T.load('$D/knn.json').reachable()))" 2>/dev/null
if [ -f $F ]; then
  $PY bench/lib_grid.py compare bench/results/lib-grid-knn-h200.json $F
  $PY bench/lib_grid.py summary $F
else
  echo "no grid results"
fi
stamp "done"
