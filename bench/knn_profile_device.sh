#!/bin/bash
# One device call after bench/knn_queue_grid_device.sh, results under $OUT/knn: the GPU tests of the queued variants,
# then the host-side cost of small kNN calls (bench/knn_host_overhead.py).
. "$(dirname "$0")/device_env.sh"
timeout 200 $PY -m pytest -q -p no:cacheprovider -m gpu tests/test_knn_queue.py > $D/tests.log 2>&1
stamp "queue tests rc=$?: $(tail -1 $D/tests.log)"
grep -E "^FAILED|Error" $D/tests.log | head -8
timeout 150 $PY bench/knn_host_overhead.py --out $D/host.json > $D/host.log 2>&1
stamp "host rc=$?"
grep -A12 "== {'Q': 1," $D/host.log | head -14
tail -10 $D/host.log
