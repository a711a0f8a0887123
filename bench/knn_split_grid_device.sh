#!/bin/bash
# One device call: the whole kNN grid (165 shapes, every 5th first) with the split path's
# fitted options (cakelib/tables/split_options/knn.json: the merge kernel at k > 1, the sampled bound for the
# wgmma splits at M >= 256K) against torch and flashlib, same run, the cubins carried compiled.
#     OUT=/some/dir bash bench/knn_split_grid_device.sh [DEADLINE_S=450]
. "$(dirname "$0")/device_env.sh"
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
knn_grid ${1:-450} 100
stamp done
