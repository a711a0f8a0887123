#!/bin/bash
# One device call, results under $OUT/knn:
#   1. the GPU tests of the kNN re-ranking (tests/test_knn_rerank.py) and of the held-wgmma-sums k-means kernels (`_rw`: ragged point tiles, K below kmax), whose
#      update now builds one one-hot fragment per step for both blocks and specializes whole tiles;
#   2. the whole kNN grid with the committed tables and the current lowering (wgmma descriptors stepped by one
#      add, the column bias at constant offsets), every 5th shape first, cut at DEADLINE_S.
# Compile first on the CPU machine and carry the cache:
#     CAKE_CACHE_DIR=DIR python bench/lib_grid.py compile --op knn --grid
#     OUT=/some/dir CAKE_CACHE_DIR=DIR bash bench/held_rw_knn_grid_device.sh [TEST_TIMEOUT_S=200] [DEADLINE_S=320]
. "$(dirname "$0")/device_env.sh"
gpu_tests ${1:-200} tests/test_knn_rerank.py tests/test_kmeans_wgmma.py -k "rerank or (held_sums and rw)"
knn_grid ${2:-320} 20
stamp done
