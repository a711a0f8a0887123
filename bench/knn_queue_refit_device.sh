#!/bin/bash
# One device call: the deferred top-k insertion's queue width re-measured at the table's
# wgmma split picks (T = 0 / 2 / 4, same run, bench/topk_queue_ab.py; SHAPES a JSON list of {Q, M, k}),
# the queue table refitted over its committed sources and this A/B, and the grid shapes whose queue the
# refit changes re-timed (-> $D/grid/, to merge over the full grid with --later-wins; the refitted table is
# $D/queue-table-after.json).
# VARIANT=A,B: A/B those variants (topk_queue_ab.py --variant) instead of the table's picks. GRID_DEADLINE_S 0:
# the A/B and the refit only.
#     OUT=/some/dir SHAPES='[...]' [VARIANT=...] bash bench/knn_queue_refit_device.sh [AB_DEADLINE_S=150] [GRID_DEADLINE_S=200]
. "$(dirname "$0")/device_env.sh"
TABLE=cakelib/tables/topk_queue/knn.json
cp $TABLE $D/queue-table-before.json
$PY bench/lib_grid.py runs knn > $D/runs-before.json
timeout $(( ${1:-150} + 60 )) $PY bench/topk_queue_ab.py --option queue --values 0,2,4 --shapes "$SHAPES" \
  ${VARIANT:+--variant "$VARIANT"} --out $D/queue-ab.json --procs $NP --deadline-s ${1:-150} > $D/ab.log 2>&1
stamp "ab rc=$?"
tail -42 $D/ab.log
sources=$($PY -c "import json; print(' '.join(json.load(open('$TABLE'))['sources']))")
$PY bench/topk_queue_ab.py --fit $sources $D/queue-ab.json --table $TABLE > $D/fit.log 2>&1
stamp "fit rc=$?"
cp $TABLE $D/queue-table-after.json
$PY bench/lib_grid.py runs knn > $D/runs-after.json
only=$($PY bench/lib_grid.py runs-changed $D/runs-before.json $D/runs-after.json)
echo "$only" > $D/changed.txt
stamp "grid shapes whose queue changed: $(echo "$only" | tr ';' '\n' | grep -c =)"
[ -n "$only" ] && [ "${2:-200}" -gt 0 ] || { stamp done; exit 0; }
timeout $(( ${2:-200} + 60 )) $PY bench/lib_grid.py grid --op knn --out $D/grid --procs $NP --deadline-s ${2:-200} \
  --spread 5 --only "$only" > $D/grid.log 2>&1
stamp "grid rc=$?"
grep -E "compiled|deadline" $D/grid.log | head -3
tail -3 $D/grid.log
