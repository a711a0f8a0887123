#!/bin/bash
# One device call, results under $OUT/knn:
#   1. the A/B's builds compile in the background (bench/topk_queue_ab.py --option share --compile-only)
#      while
#   2. the GPU-marked tests of the shared bound run, with the queued and split variants' tests;
#   3. bench/topk_queue_ab.py --option share: the split kernels the table picks at k > 1, the bound
#      off and on, same run (-> $OUT/knn/ab-share.json).
#     OUT=/some/dir bash bench/knn_bound_device.sh [AB_DEADLINE_S=240]
. "$(dirname "$0")/device_env.sh"
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
timeout 200 $PY bench/topk_queue_ab.py --option share --compile-only --procs $(( NP - 2 )) > $D/compile.log 2>&1 &
CPID=$!
timeout 200 $PY -m pytest -q -p no:cacheprovider -m gpu tests/test_knn_bound.py tests/test_knn_queue.py \
  tests/test_knn_fast.py -k "bound or queued or new_variants" > $D/tests.log 2>&1
stamp "tests rc=$?: $(tail -1 $D/tests.log)"
grep -E "^FAILED|Error" $D/tests.log | head -8
wait $CPID
stamp "precompile: $(tail -1 $D/compile.log)"
timeout $(( ${1:-240} + 60 )) $PY bench/topk_queue_ab.py --option share --out $D/ab-share.json \
  --deadline-s ${1:-240} > $D/ab.log 2>&1
stamp "ab rc=$?"
tail -27 $D/ab.log
stamp done
