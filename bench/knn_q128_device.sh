#!/bin/bash
# One device call after bench/knn_final_device.sh, results under $OUT/knn: the grid's worst shapes (Q = 64 / 128, a
# split bq 16 kernel reading the database 8 times) get training shapes of their own:
#   1. a sweep of the split mma.sync / wgmma variants at the Q = 64 / 128 training shapes (k = 1 / 10 / 16),
#      joined with the committed sweep (--prior) and the table refitted (-> $OUT/knn/sweep/knn.json);
#   2. the grid shapes whose pick the new table changes, plus every Q = 64 / 128 grid shape, timed with
#      the new table (-> $OUT/knn/grid/), to merge over that call's grid (lib_grid.py merge --later-wins).
. "$(dirname "$0")/device_env.sh"
mkdir -p $D/sweep $D/grid
timeout 240 $PY bench/lib_grid.py sweep --op knn --out $D/sweep --procs $NP --budget-s 90 \
  --only "Q=64|128,k=1|10|16" --variants "_s(8|16|32|64|128)_.*(gn_mw|wg|w32_ws4)" \
  --prior bench/results/lib-sweep-knn-h200.json > $D/sweep.log 2>&1
stamp "sweep rc=$?: $(grep -E 'compiled|probed|table ->|budget' $D/sweep.log | tr '\n' ' ')"
[ -f $D/sweep/knn.json ] || { stamp "no table"; exit 1; }
FILTER=$(CAKELIB_TABLES=$D/sweep $PY - <<'PY'
import json
from bench.lib_grid import D, knn_grid
from cakelib.dispatch import DispatchTable
import os
new = DispatchTable.load(os.path.join(os.environ["CAKELIB_TABLES"], "knn.json"))
old = DispatchTable.load("cakelib/tables/knn.json")
alts = set()
from cakelib.variants import SUPPORTS
def pick(t, sh):
    return t.pick(sh, supports=lambda n, x: SUPPORTS["knn"](t.variants[n], x))
for s in knn_grid():
    sh = {**s, "D": D, "arch": "sm_90a"}
    a = pick(old, sh); b = pick(new, sh)
    if a != b or s["Q"] in (64, 128):
        alts.add(f"Q={s['Q']},M={s['M']},k={s['k']}")
print(";".join(sorted(alts)))
PY
)
stamp "grid subset: $(echo "$FILTER" | tr ';' '\n' | wc -l) shapes"
CAKELIB_TABLES=$D/sweep timeout 130 $PY bench/lib_grid.py grid --op knn --out $D/grid --procs $NP --deadline-s 80 \
  --only "$FILTER" > $D/grid.log 2>&1
stamp "grid rc=$?"; tail -4 $D/grid.log
