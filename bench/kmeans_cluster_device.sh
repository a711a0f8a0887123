#!/bin/bash
# The wide k-means TMA form's options (CTA pairs `cluster`, point tiles `pt`, scatter batches `sb`;
# tasks/kmeans/wide_tma.py) on one GPU, results under $OUT/kmeans_wide: the GPU tests TESTS_K selects (float64
# reference), then the sweep's forms from D = MIN_D (256) side by side with the rule's pick and flashlib
# (bench/kmeans_wide_sweep.py):
#     [MIN_D=768] [TESTS_K="tma_sb or tma_t4_sb"] OUT=/some/dir bash bench/kmeans_cluster_device.sh [SWEEP_S=240]
source bench/device_env.sh
SWEEP=${1:-240}
K=$OUT/kmeans_wide; mkdir -p $K
timeout 150 $PY bench/kmeans_wide_sweep.py precompile --procs $NP --min-d ${MIN_D:-256} > $K/precompile.log 2>&1
stamp "precompile rc=$?: $(tail -1 $K/precompile.log)"
grep -v ": ok$" $K/precompile.log | head -5
timeout 180 $PY -m pytest -q -x -p no:cacheprovider -m gpu tests/test_kmeans_wide.py -k "${TESTS_K:-tma}" \
  > $K/pytest.log 2>&1
stamp "gpu tests rc=$?: $(tail -1 $K/pytest.log)"
grep -E "^FAILED|Error|Timeout" $K/pytest.log | head -5
timeout $(( SWEEP + 60 )) $PY bench/kmeans_wide_sweep.py sweep --min-d ${MIN_D:-256} --out $K/sweep.json --deadline-s $SWEEP \
  > $K/sweep.log 2>&1
stamp "sweep rc=$?"
grep -E "^\(" $K/sweep.log
