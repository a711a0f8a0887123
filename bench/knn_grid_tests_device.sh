#!/bin/bash
# One device call: the GPU tests of the merge kernel (tests/test_knn_merge_kernel.py, both
# metrics, odd shapes, the workspace left clean), then the whole kNN grid with the committed tables, every
# 5th shape first, cut at 300 s (-> $OUT/call5.tgz: knn/grid.log, knn/pytest.log, knn/lib-grid-knn-h200.json).
# Run after a change to code every kNN kernel shares (e.g. the bitonic merges of sorted lists).
#     OUT=/some/dir bash bench/knn_grid_tests_device.sh
. "$(dirname "$0")/device_env.sh"
timeout 45 $PY -m pytest -q -x -p no:cacheprovider -m gpu tests/test_knn_merge_kernel.py > $D/pytest.log 2>&1
stamp "pytest rc=$?: $(tail -1 $D/pytest.log)"
grep -E "^FAILED|Error" $D/pytest.log | head -5
knn_grid 300 30
cd $OUT && tar czf call5.tgz knn && rm -rf knn
