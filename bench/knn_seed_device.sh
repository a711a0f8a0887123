#!/bin/bash
# One device call (session 18), results under $OUT/knn:
#   1. the A/B's builds compile in the background (bench/topk_queue_ab.py --option seed --compile-only;
#      with a carried cubin cache, seconds) while
#   2. the GPU-marked tests of the sampled bound run (tests/test_knn_seed.py);
#   3. bench/topk_queue_ab.py --option seed: the kernels the table picks at k > 1, no sample (0) against
#      every 8th / 32nd database tile sampled first, same run (-> $OUT/knn/ab-seed.json).
#   4. (PROFILE=1) ncu: every kernel's duration in one plain and one seeded search at Q = 128, M = 100K,
#      k = 10 (the grid's worst shape), and the warp states / stall sources of the plain search kernel
#      (-> $OUT/knn/ncu-*.txt).
#     OUT=/some/dir [PROFILE=1] bash bench/knn_seed_device.sh [AB_DEADLINE_S=240] [VALUES=0,8,32]
. "$(dirname "$0")/device_env.sh"
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
VALUES=${2:-0,8,32}
timeout 200 $PY bench/topk_queue_ab.py --option seed --values $VALUES --compile-only --procs $(( NP - 2 )) \
  > $D/compile.log 2>&1 &
CPID=$!
timeout 200 $PY -m pytest -q -p no:cacheprovider -m gpu tests/test_knn_seed.py > $D/tests.log 2>&1
stamp "tests rc=$?: $(tail -1 $D/tests.log)"
grep -E "^FAILED|Error" $D/tests.log | head -8
wait $CPID
stamp "precompile: $(tail -1 $D/compile.log)"
timeout $(( ${1:-240} + 60 )) $PY bench/topk_queue_ab.py --option seed --values $VALUES --out $D/ab-seed.json \
  --deadline-s ${1:-240} > $D/ab.log 2>&1
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
  cat $D/ncu-durations.txt | paste - - | awk '{print $1, $(NF)}' | tail -12
fi
tail -35 $D/ab.log
stamp done
