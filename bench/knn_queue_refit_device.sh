#!/bin/bash
# One device call (session 20): the deferred top-k insertion's queue width re-measured at the table's
# wgmma split picks (T = 0 / 2 / 4, same run, bench/topk_queue_ab.py; SHAPES a JSON list of {Q, M, k}),
# the queue table refitted over its committed sources and this A/B, and the grid shapes whose queue the
# refit changes re-timed (-> $D/grid/, to merge over the full grid with --later-wins; the refitted table is
# $D/queue-table-after.json).
#     OUT=/some/dir SHAPES='[...]' bash bench/knn_queue_refit_device.sh [AB_DEADLINE_S=150] [GRID_DEADLINE_S=200]
. "$(dirname "$0")/device_env.sh"
TABLE=cakelib/tables/topk_queue/knn.json
queues() {   # grid shape ("Q=..,M=..,k=..") -> the queue width its pick runs with
  $PY - <<'PY'
import json
from bench.lib_grid import D, knn_grid
from cakelib.runtime import choose
from cakelib.variants import knn_queue
print(json.dumps({",".join(f"{k}={v}" for k, v in s.items()): knn_queue(choose("knn", {**s, "D": D})[1], s["k"])
                  for s in knn_grid()}))
PY
}
cp $TABLE $D/queue-table-before.json
queues > $D/queues-before.json
timeout $(( ${1:-150} + 60 )) $PY bench/topk_queue_ab.py --option queue --values 0,2,4 --shapes "$SHAPES" \
  --out $D/queue-ab.json --procs $NP --deadline-s ${1:-150} > $D/ab.log 2>&1
stamp "ab rc=$?"
tail -42 $D/ab.log
sources=$($PY -c "import json; print(' '.join(json.load(open('$TABLE'))['sources']))")
$PY bench/topk_queue_ab.py --fit $sources $D/queue-ab.json --table $TABLE > $D/fit.log 2>&1
stamp "fit rc=$?"
cp $TABLE $D/queue-table-after.json
queues > $D/queues-after.json
only=$($PY -c "import json; a, b = (json.load(open('$D/queues-' + w + '.json')) for w in ('before', 'after'));
print(';'.join(s for s in a if a[s] != b[s]))")
echo "$only" > $D/changed.txt
stamp "grid shapes whose queue changed: $(echo "$only" | tr ';' '\n' | grep -c =)"
[ -n "$only" ] && [ "${2:-200}" -gt 0 ] || { stamp done; exit 0; }
timeout $(( ${2:-200} + 60 )) $PY bench/lib_grid.py grid --op knn --out $D/grid --procs $NP --deadline-s ${2:-200} \
  --spread 5 --only "$only" > $D/grid.log 2>&1
stamp "grid rc=$?"
grep -E "compiled|deadline" $D/grid.log | head -3
tail -3 $D/grid.log
