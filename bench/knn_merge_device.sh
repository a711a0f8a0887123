#!/bin/bash
# One device call (session 18), results under $OUT/knn:
#   1. the A/B's builds compile in the background (with a carried cubin cache, seconds) while
#   2. the GPU-marked tests of the merge kernel and the sampled bound run;
#   3. bench/topk_queue_ab.py --option merge: the split kernels the table picks, the last-CTA merge
#      ("wide") against the merge kernel and the merge kernel with the sampled bound, same run
#      (-> $OUT/knn/ab-merge.json).
#     OUT=/some/dir bash bench/knn_merge_device.sh [AB_DEADLINE_S=240] [VALUES=wide,kernel,kernel_sd8]
. "$(dirname "$0")/device_env.sh"
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
VALUES=${2:-wide,kernel,kernel_sd8}
timeout 200 $PY bench/topk_queue_ab.py --option merge --values $VALUES --compile-only --procs $(( NP - 2 )) \
  > $D/compile.log 2>&1 &
CPID=$!
timeout 240 $PY -m pytest -q -p no:cacheprovider -m gpu tests/test_knn_merge_kernel.py > $D/tests.log 2>&1
stamp "tests rc=$?: $(tail -1 $D/tests.log)"
grep -E "^FAILED|Error" $D/tests.log | head -8
wait $CPID
stamp "precompile: $(tail -1 $D/compile.log)"
timeout $(( ${1:-240} + 60 )) $PY bench/topk_queue_ab.py --option merge --values $VALUES --out $D/ab-merge.json \
  --deadline-s ${1:-240} > $D/ab.log 2>&1
stamp "ab rc=$?"
tail -34 $D/ab.log
stamp done
