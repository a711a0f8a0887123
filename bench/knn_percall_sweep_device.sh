#!/bin/bash
# One device call: the kNN split variants re-swept at the k > 1 training shapes with Q <= 8192
# in the form the library runs them (their per-call options: the merge kernel, the sampled bound; the
# committed sweep timed them with the last-CTA merge), beside a few unsplit kernels (the prior's rescale
# and the Q = 8192 picks); joined with the committed sweep (--prior, rescaled) and the table refitted;
# then the grid shapes whose pick the refit changed, re-timed (-> $OUT/knn/grid/).
#     OUT=/some/dir [ONLY=shapes] [PAT=variant-regex] [PRIOR=sweep.json] [FULL=1] \
#       bash bench/knn_percall_sweep_device.sh [SWEEP_BUDGET_S=330] [GRID_DEADLINE_S=120]
# (call 1: the defaults; calls 2 / 3: ONLY the training shapes added after call 1 / 2, PRIOR its sweep;
# FULL=1: the whole grid with the refitted table instead of the re-picked shapes; GRID_DEADLINE_S 0: the sweep
# and its table only, $D/sweep/knn.json)
. "$(dirname "$0")/device_env.sh"
PAT=${PAT:-'(bq16_bn32_s128_p4_gn_mw$|bq16_bn32_s128_p4_mw$|bq64_bn64_s32_p2_gn_mw$|bq16_bn32_s32_p4_mw_ws4$|bq16_bn32_s128_p4_mw_ws4$|bq16_bn32_s128_p4_gn_mw_ws4$|bq16_bn64_s64_p2_mw_ws4$|bq32_bn32_s64_p3_mw_w32_ws4$|bq64_bn128_s128_p3_mw_wg$|bq128_bn64_s(8|16|32|64|128)_p4(_b2)?_mw_wg$|bq16_bn32_s(32|128)_p4_b4_mw_ws4$|bq64_bn64_s256_p4_mw_wg_ov$|bq64_bn64_s8_p2_gn_b3_mw$|bq128_bn64_s1_p4(_b2)?_wg$|bq32_bn64_s1_p2_gn$|bq64_bn64_s1_p2_gn$)'}
ONLY=${ONLY:-'k=10|16|32,Q=1|4|16|32|64|128|256|512|1024|2048|4096|8192'}
timeout $(( ${1:-330} + 150 )) $PY bench/lib_grid.py sweep --op knn --out $D/sweep --procs $NP --budget-s ${1:-330} \
  --only "$ONLY" --variants "$PAT" --prior ${PRIOR:-bench/results/lib-sweep-knn-h200.json} > $D/sweep.log 2>&1
stamp "sweep rc=$?"
grep -E "compiled|probe|budget|table" $D/sweep.log | head -8
[ -f $D/sweep/knn.json ] || { stamp "no table"; exit 1; }
if [ "${2:-120}" = 0 ]; then           # the sweep and its table only
  :
elif [ "${FULL:-0}" = 1 ]; then          # the whole grid with the refitted table, one run
  cp $D/sweep/knn.json cakelib/tables/knn.json
  knn_grid ${2:-400} 100
else
  regrid_changed knn ${2:-120}
  grep -E "^knn \{" $D/grid.log | cut -c1-160 | tail -60
  tail -2 $D/grid.log
fi
stamp done
