#!/bin/bash
# One device call: the wgmma kNN kernels' database norms reduced from each staged tile
# (norms "tile", to be made the default in the tree sent for the grid) against a norms kernel's read of the whole database first
# ("global"): a same-run A/B at the table's wgmma picks (bench/topk_queue_ab.py --option norms), then the
# grid shapes whose pick is a wgmma kernel re-timed (-> $OUT/knn/grid/, to merge over the full grid with
# --later-wins: the other shapes' kernels are unchanged).
#     OUT=/some/dir bash bench/knn_wgnorms_device.sh [AB_DEADLINE_S=120] [GRID_DEADLINE_S=220]
. "$(dirname "$0")/device_env.sh"
if [ "${1:-120}" -gt 0 ]; then         # (AB_DEADLINE_S 0: the grid shapes only)
  timeout $(( ${1:-120} + 60 )) $PY bench/topk_queue_ab.py --option norms --out $D/norms-ab.json --procs $NP \
    --deadline-s ${1:-120} > $D/ab.log 2>&1
  stamp "ab rc=$?"
  tail -21 $D/ab.log
fi
[ "${2:-220}" -gt 0 ] || { stamp done; exit 0; }   # (GRID_DEADLINE_S 0: the A/B only)
only=$($PY -c "import json; from bench.lib_grid import runs
print(';'.join(s for s, p in runs('knn').items() if p.get('mma') == 'wgmma'))")
stamp "grid shapes on wgmma kernels: $(echo "$only" | tr ';' '\n' | grep -c =)"
timeout $(( ${2:-220} + 60 )) $PY bench/lib_grid.py grid --op knn --out $D/grid --procs $NP --deadline-s ${2:-220} --spread 5 \
  --only "$only" > $D/grid.log 2>&1
stamp "grid rc=$?"
grep -E "compiled|deadline" $D/grid.log | head -3
tail -3 $D/grid.log
