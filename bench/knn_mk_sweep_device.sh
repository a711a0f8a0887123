#!/bin/bash
# One device call (session 18): the Q = 32 / 64 training shapes swept over the 64-query wgmma splits with
# the merge kernel (with and without the sampled bound) beside the current picks there, joined with the
# committed sweep (--prior, rescaled) and the table refitted; then the grid shapes whose pick the refit
# changed, re-timed (-> $OUT/knn/grid/, to merge over the session's grid with --later-wins).
#     OUT=/some/dir bash bench/knn_mk_sweep_device.sh [SWEEP_BUDGET_S=120] [GRID_DEADLINE_S=150]
. "$(dirname "$0")/device_env.sh"
PAT='(_mk|bq16_bn32_s32_p4_mw_ws4$|bq32_bn32_s64_p3_mw_w32_ws4$|bq64_bn128_s128_p3_mw_wg$|bq16_bn32_s128_p4_mw_ws4$|bq16_bn64_s64_p2_mw_ws4$|bq128_bn64_s128_p4_mw_wg$)'
timeout $(( ${1:-120} + 90 )) $PY bench/lib_grid.py sweep --op knn --out $D/sweep --procs $NP --budget-s ${1:-120} \
  --only "Q=32|64" --variants "$PAT" --prior bench/results/lib-sweep-knn-h200.json > $D/sweep.log 2>&1
stamp "sweep rc=$?"
grep -E "compiled|probe|budget|table" $D/sweep.log | head -6
[ -f $D/sweep/knn.json ] || { stamp "no table"; exit 1; }
regrid_changed knn ${2:-150}
grep -E "^knn \{" $D/grid.log | awk '{print $0}' | cut -c1-160 | tail -40
tail -2 $D/grid.log
stamp done
