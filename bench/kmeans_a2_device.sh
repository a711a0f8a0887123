#!/bin/bash
# One device call, results under $OUT/knn:
#   1. the GPU tests of the paired centroid tiles (k-means astages 2, tests/test_kmeans_wgmma.py -k paired);
#   2. a k-means sweep of the K >= 100 training shapes: the paired-tile variants (bn 32, two accumulators) and
#      their one-accumulator bn 32 controls beside the committed table's picks there, joined with the committed
#      sweep (--prior) -> $D/kmeans-sweep/ (refit locally: lib_grid.py refit ... --keep-tree);
#   3. the whole kNN grid with the committed tables (the refitted queue table and pins) -> $D/.
# Compile first on the CPU machine and carry the cache:
#     CAKE_CACHE_DIR=DIR python bench/lib_grid.py compile --op kmeans --only "$KONLY" --variants "$KPAT"
#     CAKE_CACHE_DIR=DIR python bench/lib_grid.py compile --op knn --grid
#     OUT=/some/dir CAKE_CACHE_DIR=DIR bash bench/kmeans_a2_device.sh [SWEEP_BUDGET_S=120] [GRID_DEADLINE_S=320]
. "$(dirname "$0")/device_env.sh"
export KONLY='K=100|128|160|256'
export KPAT='(k128_bm128_bn64_p132_mma32_wg$|k(128|256)_bm128_bn64_p(16|33|132)_mma16_wg_rw128$|_bn32_p(16|33|132)_mma16_wg_rw128(_a2)?$|k128_bm128_bn64_p132_mma16_wg_rw128_a2$)'
gpu_tests 120 tests/test_kmeans_wgmma.py -k paired
kmeans_sweep ${1:-120} "$KONLY" "$KPAT"
knn_grid ${2:-320} 60
stamp done
