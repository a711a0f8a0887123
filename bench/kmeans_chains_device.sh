#!/bin/bash
# One device call, results under $OUT/knn:
#   1. the GPU tests of the argmin chains and the paired centroid tiles (tests/test_kmeans_wgmma.py);
#   2. a k-means sweep of the K >= 100 training shapes: the picks there with the argmin's running bests in 2 / 4
#      chains (topk `chains`) beside the picks themselves, joined with the committed sweep (--prior) ->
#      $D/kmeans-sweep/ (refit locally).
# Compile first on the CPU machine and carry the cache:
#     CAKE_CACHE_DIR=DIR python bench/lib_grid.py compile --op kmeans --only "$KONLY" --variants "$KPAT"
#     OUT=/some/dir CAKE_CACHE_DIR=DIR bash bench/kmeans_chains_device.sh [SWEEP_BUDGET_S=150]
. "$(dirname "$0")/device_env.sh"
export KONLY='K=100|128|160|256'
export KPAT='(k128_bm128_bn64_p132_mma32_wg(_ch[24])?$|k(128|256)_bm128_bn64_p(16|33|132)_mma16_wg_rw128(_ch[24])?$)'
gpu_tests 150 tests/test_kmeans_wgmma.py -k "chains or paired"
kmeans_sweep ${1:-150} "$KONLY" "$KPAT"
stamp done
