#!/bin/bash
# One device call, results under $OUT/knn, the cubins carried compiled (CAKE_CACHE_DIR):
#   1. the GPU tests of the shared bound and of the padded rows (tests/test_knn_bound.py);
#   2. bench/topk_queue_ab.py --option skip_pad: the padded query rows entering the insertion or not,
#      at few-query shapes, same run (-> $OUT/knn/ab-pad.json);
#   3. the kNN grid (165 shapes, every 5th first) with the committed tables: every k > 1 kernel changed
#      (valid_rows), so the whole grid is re-timed.
#     OUT=/some/dir bash bench/knn_pad_device.sh [GRID_DEADLINE_S=300]
. "$(dirname "$0")/device_env.sh"
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
timeout 150 $PY -m pytest -q -p no:cacheprovider -m gpu tests/test_knn_bound.py > $D/tests.log 2>&1
stamp "tests rc=$?: $(tail -1 $D/tests.log)"
grep -E "^FAILED|Error" $D/tests.log | head -8
timeout 100 $PY bench/topk_queue_ab.py --option skip_pad --out $D/ab-pad.json --deadline-s 60 > $D/ab.log 2>&1
stamp "ab rc=$?"
tail -18 $D/ab.log
knn_grid ${1:-300} 40
stamp done
