#!/bin/bash
# A one-launch merge of the split search (FORM=tail: the tile's last CTAs, a warp per row, tests/test_knn_merge_tail.py;
# FORM=rows: the last-CTA merge over the real query rows, tests/test_knn_merge_rows.py) on one GPU, one call,
# results under $OUT/$FORM (tarred into $OUT/$FORM.tgz: the machine returns at most 8 files):
#   1. its GPU tests (float64 checks, workspace left clean) while the A/B's builds compile;
#   2. the merge kernel against it at the few-query stream picks (bench/knn_merge_launch_shapes.json;
#      bench/topk_queue_ab.py --option merge --values kernel,$FORM);
#   3. where the tests passed: its Q range fitted from the A/B (--fit-merge-form, written into
#      cakelib/tables/split_options/knn.json, copied to $OUT/$FORM) and, where it has one, the host A/B of
#      PREV (a tree of the library before it, default .prev) against this tree with that table.
#     OUT=/some/dir [FORM=tail] [PREV=.prev] [TESTS_S=150] bash bench/knn_merge_launch_device.sh [AB_DEADLINE_S=120]
#   (HOST_ROUNDS / HOST_DEADLINE_S: passed to bench/host_overhead_ab_device.sh)
. "$(dirname "$0")/device_env.sh"
FORM=${FORM:-tail}
R=$OUT/$FORM; mkdir -p $R/h
nvidia-smi --query-gpu=name --format=csv,noheader
S="$(cat bench/knn_merge_launch_shapes.json)"
timeout 150 $PY bench/topk_queue_ab.py --option merge --values kernel,$FORM --shapes "$S" --compile-only \
  --procs $NP > $R/compile.log 2>&1 &
timeout ${TESTS_S:-150} $PY -m pytest -q -p no:cacheprovider -m gpu tests/test_knn_merge_$FORM.py > $R/tests.log 2>&1
T=$?
stamp "tests rc=$T: $(tail -1 $R/tests.log)"
grep -E "^FAILED|Error" $R/tests.log | head -5
wait
timeout $(( ${1:-120} + 50 )) $PY bench/topk_queue_ab.py --option merge --values kernel,$FORM --shapes "$S" \
  --out $R/ab-$FORM.json --deadline-s ${1:-120} --procs $NP > $R/ab.log 2>&1
stamp "ab rc=$?"
tail -27 $R/ab.log
if [ $T = 0 ]; then
  $PY bench/topk_queue_ab.py --fit-merge-form $FORM $R/ab-$FORM.json | tee $R/fit.txt
  cp cakelib/tables/split_options/knn.json $R/split_options.json
  grep -q max_Q $R/fit.txt && PREV=${PREV:-.prev} OUT=$R/h timeout 250 bash bench/host_overhead_ab_device.sh 2>&1 \
    | grep -vE "^\[" | tail -24
fi
tar czf $OUT/$FORM.tgz -C $OUT $FORM && rm -rf $R
stamp done
