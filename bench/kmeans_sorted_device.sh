#!/bin/bash
# The wide k-means' centroid sums by a counting sort (`sums: "sorted"`, tasks/kmeans/sorted_sums.py) on one GPU,
# one call, results under $OUT/sorted (tarred into $OUT/sorted.tgz):
#   1. its forms and the rule's picks precompiled for the sweep's shapes from D = 256;
#   2. its GPU tests (tests/test_kmeans_sorted_sums.py: a float64 Lloyd step, 1 and 3 iterations);
#   3. bench/kmeans_wide_sweep.py --forms pick,sorted: per shape each form checked against float64, then 10
#      iterations timed beside flashlib (CUDA events, L2 flushed), cut at DEADLINE_S.
#     OUT=/some/dir [MIN_D=256] [TESTS_S=150] bash bench/kmeans_sorted_device.sh [DEADLINE_S=200]
. "$(dirname "$0")/device_env.sh"
R=$OUT/sorted; mkdir -p $R
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 150 $PY bench/kmeans_wide_sweep.py precompile --procs $NP --min-d ${MIN_D:-256} --forms pick,sorted > $R/precompile.log 2>&1
stamp "precompile rc=$?: $(tail -1 $R/precompile.log)"
timeout ${TESTS_S:-150} $PY -m pytest -q -p no:cacheprovider -m gpu tests/test_kmeans_sorted_sums.py > $R/tests.log 2>&1
stamp "tests rc=$?: $(tail -1 $R/tests.log)"
grep -E "^FAILED|Error" $R/tests.log | head -5
timeout $(( ${1:-200} + 60 )) $PY bench/kmeans_wide_sweep.py sweep --min-d ${MIN_D:-256} --forms pick,sorted \
  --out $R/kmeans-sorted-sweep.json --deadline-s ${1:-200} > $R/sweep.log 2>&1
stamp "sweep rc=$?"
tail -8 $R/sweep.log
tar czf $OUT/sorted.tgz -C $OUT sorted && rm -rf $R
stamp done
