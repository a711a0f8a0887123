#!/bin/bash
# The ping-pong k-means form (tasks/kmeans/wide_pingpong.py) on one GPU, results under $OUT: its GPU tests, then
# the wide forms side by side up to D = 512 (bench/kmeans_wide_sweep.py, flashlib in the same run):
#     OUT=/some/dir bash bench/kmeans_pingpong_device.sh [SWEEP_S=300]
source bench/device_env.sh
SWEEP=${1:-300}
K=$OUT/kmeans_wide; mkdir -p $K
timeout 120 $PY bench/kmeans_wide_sweep.py precompile --procs $NP --max-d 512 > $K/precompile.log 2>&1
stamp "precompile rc=$?: $(tail -1 $K/precompile.log)"
grep -v ": ok$" $K/precompile.log | head -5
timeout 240 $PY -m pytest -q -x -p no:cacheprovider -m gpu tests/test_kmeans_wide.py -k "${TESTS_K:-pp}" \
  > $K/pytest.log 2>&1
stamp "gpu tests rc=$?: $(tail -1 $K/pytest.log)"
grep -E "^FAILED|Error" $K/pytest.log | head -5
timeout $(( SWEEP + 60 )) $PY bench/kmeans_wide_sweep.py sweep --max-d 512 --out $K/sweep.json --deadline-s $SWEEP \
  > $K/sweep.log 2>&1
stamp "sweep rc=$?"
grep -E "^\(" $K/sweep.log
