#!/bin/bash
# One device call, results under $OUT/knn:
#   1. the GPU tests of the static centroid sequence (k-means `aunroll`, tests/test_kmeans_wgmma.py);
#   2. a k-means sweep of the K = 256 training shapes: the static-sequence variants (bn 32 / 64) beside the picks
#      there, joined with the committed sweep (--prior);
#   3. the committed table's tree kept, its pins redone from this sweep's rows (refit --keep-tree), and the grid
#      shapes whose pick that changes re-timed with it, baselines in the same run (-> $D/grid/, to merge over the
#      committed grid with `lib_grid.py merge --later-wins`).
# Compile first on the CPU machine and carry the cache:
#     CAKE_CACHE_DIR=DIR python bench/lib_grid.py compile --op kmeans --only "$KONLY" --variants "$KPAT"
#     OUT=/some/dir CAKE_CACHE_DIR=DIR bash bench/kmeans_au_device.sh [SWEEP_BUDGET_S=90] [GRID_DEADLINE_S=60]
. "$(dirname "$0")/device_env.sh"
export KONLY='K=256'
export KPAT='(k256_bm128_bn64_p(16|33|132)_mma16_wg_rw128$|_a2u$)'
gpu_tests 100 tests/test_kmeans_wgmma.py -k static_centroid
kmeans_sweep ${1:-90} "$KONLY" "$KPAT"
$PY bench/lib_grid.py refit $D/kmeans-sweep/lib-sweep-h200.json --keep-tree cakelib/tables/kmeans.json --out $D/repin \
  > $D/repin.log 2>&1
stamp "repin rc=$?: $(tail -1 $D/repin.log)"
regrid_changed kmeans ${2:-60} $D/repin/kmeans.json
[ -f $D/grid.log ] && grep -E "^kmeans \{" $D/grid.log | cut -c1-200
stamp done
