#!/bin/bash
# One device call: the k = 16 / 32 builds on wgmma with the deferred insertion's queue, and the
# sparse sample at few queries, swept in one run. An earlier sweep timed the wgmma builds with T = 0 (the
# queue table had no entry for them: it was fitted at the picks of its day), where the mma.sync build's T = 2
# bought 1.17x at k = 16 and 2.4x at k = 32 (bench/results/topk-queue-ab-h200.json).
#   1. bench/knn_queue_refit_device.sh with VARIANT: same-run A/B of T = 0 / 2 / 4 on the unsplit wgmma builds
#      (capped b2 too) at Q = M = 16K-64K, k = 16 / 32, the queue table refitted with it (-> $D/queue-*.json);
#   2. one sweep (bench/knn_percall_sweep_device.sh, no grid) with the new queues:
#      - the k = 16 / 32 builds beside the mma.sync picks and the two-CTA mma.sync build `bq128_bn32_s1_p3_gn_b2_qs`
#        (Q = M = 16384 at k = 16 is a training shape);
#      - the sparse sample (`_sd16` / `_sd32`) at Q = 32-256, M >= 1M, beside the picks there (the earlier
#        sweep timed it only at Q = 64, M = 4M);
#      the table refitted with its pins -> $D/sweep/knn.json. The whole grid is the next call
#      (bench/knn_grid_device.sh) once the tables are committed: both steps and the grid overrun one call.
# Compile first on the CPU machine and carry the cache (SHAPES, VARIANT, ONLY, PAT as below):
#     CAKE_CACHE_DIR=DIR python bench/topk_queue_ab.py --option queue --values 0,2,4 --shapes "$SHAPES" \
#       --variant "$VARIANT" --compile-only --arch sm_90a
#     CAKE_CACHE_DIR=DIR python bench/lib_grid.py compile --op knn --only "$ONLY" --variants "$PAT"
#     OUT=/some/dir CAKE_CACHE_DIR=DIR bash bench/knn_build_queue_device.sh [AB_DEADLINE_S=120] [SWEEP_BUDGET_S=220]
export SHAPES='[{"Q":16384,"M":16384,"k":16},{"Q":32768,"M":32768,"k":16},{"Q":65536,"M":65536,"k":16},{"Q":16384,"M":16384,"k":32},{"Q":32768,"M":32768,"k":32},{"Q":65536,"M":65536,"k":32}]'
export VARIANT=knn_bq128_bn64_s1_p4_wg,knn_bq128_bn64_s1_p4_b2_wg
export ONLY='Q=16384|32768|65536,k=16|32;Q=32|64|128|256,M=1048576|4194304,k=10|16'
export PAT='(bq128_bn64_s1_p4(_b2)?_wg$|bq128_bn64_s1_p2_gn$|bq128_bn32_s1_p3_gn_b2_qs$|bq64_bn64_s1_p2_gn_b4_qs$|bq128_bn64_s128_p4_mw_wg$|bq16_bn32_s128_p4_mw_ws4$|bq64_bn64_s256_p4_mw_wg_ov(_sd32)?$|_s(128|256)_p4_mw_wg(_ov)?_sd(16|32)$)'
bash "$(dirname "$0")/knn_queue_refit_device.sh" "${1:-120}" 0 || exit 1
exec bash "$(dirname "$0")/knn_percall_sweep_device.sh" "${2:-220}" 0
