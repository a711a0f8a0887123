#!/bin/bash
# One device call: the whole k-means grid (245 shapes) with the committed tables in one run, every 5th
# shape first, cut at DEADLINE_S (default 565: one run timed 236 of the 245 shapes in 520 s, most of it
# the baselines' Triton compiles and autotuning) -> $OUT/kmeans.tgz (kmeans/grid.log,
# kmeans/lib-grid-kmeans-h200.json). Carry the dispatched cubins compiled on the CPU machine first:
#     CAKE_CACHE_DIR=DIR python bench/lib_grid.py compile --op kmeans --grid
#     OUT=/some/dir CAKE_CACHE_DIR=DIR bash bench/kmeans_grid_device.sh [DEADLINE_S=565]
set -u
T0=$(date +%s)
export PYTHONUNBUFFERED=1 CAKE_CACHE_DIR=${CAKE_CACHE_DIR:-/tmp/cake}
PY=${PYTHON:-python3}
D=$OUT/kmeans; mkdir -p $D
DL=${1:-565}
timeout $(( DL + 20 )) $PY bench/lib_grid.py grid --op kmeans --out $D --procs $(( $(nproc) - 2 )) \
  --deadline-s $DL --spread 5 > $D/grid.log 2>&1
echo "[$(( $(date +%s) - T0 )) s] grid rc=$?"
grep -E "compiled|deadline" $D/grid.log | head -3
tail -3 $D/grid.log
cd $OUT && tar czf kmeans.tgz kmeans && rm -rf kmeans
