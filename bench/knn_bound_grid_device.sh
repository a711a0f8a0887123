#!/bin/bash
# One device call (session 16): the kNN grid (165 shapes, every 5th first) with the refitted table
# (call 2's sweep) against torch and flashlib, same run, the cubins carried compiled (CAKE_CACHE_DIR).
#     OUT=/some/dir bash bench/knn_bound_grid_device.sh [DEADLINE_S=420]
. "$(dirname "$0")/device_env.sh"
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
timeout $(( ${1:-420} + 100 )) $PY bench/lib_grid.py grid --op knn --out $D --procs $NP --deadline-s ${1:-420} \
  --spread 5 > $D/grid.log 2>&1
stamp "grid rc=$?"
grep -E "compiled|deadline|geomean" $D/grid.log | head -6
tail -3 $D/grid.log
stamp done
