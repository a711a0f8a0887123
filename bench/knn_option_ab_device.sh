#!/bin/bash
# One device call, results under $OUT/knn: a kNN build option's same-run A/B with its GPU tests.
#   1. the A/B's builds compile in the background (bench/topk_queue_ab.py --compile-only; with a carried
#      cubin cache, seconds) while
#   2. the option's GPU-marked tests run (seed: tests/test_knn_seed.py, merge: tests/test_knn_merge_kernel.py);
#   3. bench/topk_queue_ab.py --option OPTION --values VALUES at the table's picks (-> $OUT/knn/ab-OPTION.json);
#   4. (PROFILE=1) ncu: every kernel's duration in one plain and one seeded search at Q = 128, M = 100K,
#      k = 10 (once the grid's worst shape), and the warp states / stall sources of the plain
#      search kernel (-> $OUT/knn/ncu-*.txt).
#     OUT=/some/dir [PROFILE=1] [SHAPES='[{"Q": 8, "M": 100000, "k": 10}, ...]'] bash bench/knn_option_ab_device.sh \
#       seed|merge [AB_DEADLINE_S=240] [VALUES]
# (SHAPES: the A/B's shapes instead of the option's own list)
# Runs so far: `seed 270 0,8,32`, `PROFILE=1 ... seed 240 0,4,8,16`, `merge 240` (values
# wide,kernel,kernel_sd8).
. "$(dirname "$0")/device_env.sh"
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
OPT=$1
VALUES=${3:-$([ "$OPT" = merge ] && echo wide,kernel,kernel_sd8 || echo 0,8,32)}
TESTS=$([ "$OPT" = merge ] && echo tests/test_knn_merge_kernel.py || echo tests/test_knn_seed.py)
timeout 200 $PY bench/topk_queue_ab.py --option $OPT --values $VALUES --compile-only --procs $(( NP - 2 )) \
  ${SHAPES:+--shapes "$SHAPES"} \
  > $D/compile.log 2>&1 &
CPID=$!
timeout 240 $PY -m pytest -q -p no:cacheprovider -m gpu $TESTS > $D/tests.log 2>&1
stamp "tests rc=$?: $(tail -1 $D/tests.log)"
grep -E "^FAILED|Error" $D/tests.log | head -8
wait $CPID
stamp "precompile: $(tail -1 $D/compile.log)"
timeout $(( ${2:-240} + 60 )) $PY bench/topk_queue_ab.py --option $OPT --values $VALUES --out $D/ab-$OPT.json \
  ${SHAPES:+--shapes "$SHAPES"} --deadline-s ${2:-240} > $D/ab.log 2>&1
stamp "ab rc=$?"
if [ "${PROFILE:-0}" = 1 ]; then
  V='{"mma": "wgmma", "bq": 128, "bn": 64, "split": 128, "stages": 4, "merge": "wide"}'
  VS='{"mma": "wgmma", "bq": 128, "bn": 64, "split": 128, "stages": 4, "merge": "wide", "seed": 8}'
  for v in "$V" "$VS"; do
    timeout 100 ncu --clock-control none --metrics gpu__time_duration.sum -k regex:knn \
      $PY bench/profile_lib.py knn 128 100000 10 "$v" 2>&1 | grep -E "^  [a-z]|gpu__time_duration" >> $D/ncu-durations.txt
  done
  timeout 150 ncu --clock-control none --section SpeedOfLight --section Occupancy --section WarpStateStats \
    --section SourceCounters --section LaunchStats -k regex:wg_s128 --launch-skip 1 --launch-count 1 \
    $PY bench/profile_lib.py knn 128 100000 10 "$V" > $D/ncu-q128-search.txt 2>&1
  stamp "ncu rc=$?"
  paste - - < $D/ncu-durations.txt | awk '{print $1, $(NF)}' | tail -12
fi
tail -35 $D/ab.log
stamp done
