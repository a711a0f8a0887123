#!/bin/bash
# One device call: the kNN grid (165 shapes, every 5th first) with the refitted table (bench/knn_bound_sweep_device.sh's
# sweep) against torch and flashlib, same run, the cubins carried compiled (CAKE_CACHE_DIR).
#     OUT=/some/dir bash bench/knn_bound_grid_device.sh [DEADLINE_S=420]
. "$(dirname "$0")/device_env.sh"
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
knn_grid ${1:-420} 100
stamp done
