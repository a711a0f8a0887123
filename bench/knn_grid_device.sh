#!/bin/bash
# One device call: the whole kNN grid (165 shapes, every 5th first) with the committed tables, baselines in
# the same run, cut at DEADLINE_S (~272 s for all of it on an H200) -> $OUT/knn/lib-grid-knn-h200.json, grid.log.
# Compile first on the CPU machine and carry the cache:
#     CAKE_CACHE_DIR=DIR python bench/lib_grid.py compile --op knn --grid
#     OUT=/some/dir CAKE_CACHE_DIR=DIR bash bench/knn_grid_device.sh [DEADLINE_S=320]
. "$(dirname "$0")/device_env.sh"
knn_grid "${1:-320}" 60
stamp done
