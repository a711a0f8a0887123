#!/bin/bash
# The k-means TMA form's batched scatter (sb) on one GPU, results under $OUT/kmeans_wide: its GPU tests (float64
# reference), then the sweep's D >= 768 shapes: the rule's pick (sb) beside the form without it, in CTA pairs and
# over 4 point tiles a CTA (bench/kmeans_wide_sweep.py), flashlib in the same run:
#     OUT=/some/dir bash bench/kmeans_sb_device.sh [SWEEP_S=150]
source bench/device_env.sh
SWEEP=${1:-150}
K=$OUT/kmeans_wide; mkdir -p $K
timeout 120 $PY bench/kmeans_wide_sweep.py precompile --procs $NP --min-d 768 > $K/precompile.log 2>&1
stamp "precompile rc=$?: $(tail -1 $K/precompile.log)"
grep -v ": ok$" $K/precompile.log | head -5
timeout 120 $PY -m pytest -q -p no:cacheprovider -m gpu tests/test_kmeans_wide.py -k "${TESTS_K:-tma_sb or tma_t4_sb}" \
  > $K/pytest.log 2>&1
stamp "gpu tests rc=$?: $(tail -1 $K/pytest.log)"
grep -E "^FAILED|Error" $K/pytest.log | head -5
timeout $(( SWEEP + 60 )) $PY bench/kmeans_wide_sweep.py sweep --min-d 768 --out $K/sweep.json --deadline-s $SWEEP \
  > $K/sweep.log 2>&1
stamp "sweep rc=$?"
grep -E "^\(" $K/sweep.log
