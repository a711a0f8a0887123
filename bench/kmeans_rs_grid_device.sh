#!/bin/bash
# One device call after bench/kmeans_rs_device.sh: the GPU tests its timeout cut (the kNN shared bound's,
# the two-stream cakelib test), then the whole k-means grid with the refitted table (the register-held
# sums variants in it), every 5th shape first so a cut grid still spans the grid (-> $OUT/kmeans/).
# The cubins come compiled (CAKE_CACHE_DIR carried).
#     OUT=/some/dir bash bench/kmeans_rs_grid_device.sh [GRID_DEADLINE_S=380]
. "$(dirname "$0")/device_env.sh"
D=$OUT/kmeans; mkdir -p $D
timeout 110 $PY -m pytest -q -p no:cacheprovider -m gpu tests/test_cakelib.py tests/test_knn_bound.py \
  -k "stream or bound" -rA > $D/tests.log 2>&1
stamp "tests rc=$?: $(tail -1 $D/tests.log)"
grep -E "^(PASSED|FAILED)" $D/tests.log | head -30
timeout $(( ${1:-380} + 60 )) $PY bench/lib_grid.py grid --op kmeans --out $D --procs $NP --deadline-s ${1:-380} \
  --spread 5 > $D/grid.log 2>&1
stamp "grid rc=$?"
grep -E "compiled|deadline" $D/grid.log | head -3
F=$D/lib-grid-kmeans-h200.json; [ -f $F ] || F=$D/lib-grid-kmeans-h200.partial.json
$PY bench/lib_grid.py compare bench/results/lib-grid-kmeans-h200.json $F
$PY bench/lib_grid.py summary $F
stamp done
