#!/bin/bash
# One device call, results under $OUT/knn:
#   1. the A/B's builds compile in the background (bench/topk_queue_ab.py --compile-only) while
#   2. the GPU-marked knn tests run (the queued variants among them);
#   3. bench/topk_queue_ab.py: queue T = 0 / 2 / 4 / 8 at 16 shapes, same run (-> $OUT/knn/ab.json).
#     OUT=/some/dir bash bench/knn_queue_device.sh [AB_DEADLINE_S=300]
. "$(dirname "$0")/device_env.sh"
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
timeout 200 $PY bench/topk_queue_ab.py --compile-only --procs $(( NP - 2 )) > $D/compile.log 2>&1 &
CPID=$!
timeout 240 $PY -m pytest -q -p no:cacheprovider -m gpu tests/test_knn_fast.py tests/test_knn_wgmma.py \
  -k "new_variants or wgmma_variants_match" > $D/tests.log 2>&1
stamp "tests rc=$?: $(tail -1 $D/tests.log)"
grep -E "^FAILED|Error" $D/tests.log | head -8
wait $CPID
stamp "precompile: $(tail -1 $D/compile.log)"
timeout $(( ${1:-300} + 60 )) $PY bench/topk_queue_ab.py --out $D/ab.json --deadline-s ${1:-300} > $D/ab.log 2>&1
stamp "ab rc=$?"
tail -19 $D/ab.log
stamp done
