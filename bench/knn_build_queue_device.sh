#!/bin/bash
# One device call (written in session 21 for the next): the k = 16 / 32 builds on wgmma with the deferred
# insertion's queue. The session-21 sweep timed the wgmma builds with T = 0 (the queue table had no entry for
# them: it was fitted at the picks of its day), where the mma.sync build's T = 2 bought 1.17x at k = 16 and
# 2.4x at k = 32 (bench/results/topk-queue-ab-h200.json); T = 0 is also 250 registers at k = 32 (T = 2: 217).
#   1. bench/knn_queue_refit_device.sh with VARIANT: same-run A/B of T = 0 / 2 / 4 on the unsplit wgmma builds
#      (capped b2 at k = 16 too) at Q = M = 16K-64K, k = 16 / 32, the queue table refitted with it;
#   2. a sweep of the k = 16 / 32 builds with the new queues beside the mma.sync picks (Q = M = 16384 at k = 16
#      is a training shape since session 21), the refit with pins, all 165 grid shapes in one run
#      (bench/knn_percall_sweep_device.sh FULL=1).
# Compile first on the CPU machine and carry the cache:
#     CAKE_CACHE_DIR=DIR python bench/topk_queue_ab.py --option queue --values 0,2,4 --shapes "$SHAPES" \
#       --variant "$VARIANT" --compile-only --arch sm_90a       (SHAPES, VARIANT as below)
#     OUT=/some/dir CAKE_CACHE_DIR=DIR bash bench/knn_build_queue_device.sh [SWEEP_BUDGET_S=100] [GRID_DEADLINE_S=300]
export SHAPES='[{"Q":16384,"M":16384,"k":16},{"Q":32768,"M":32768,"k":16},{"Q":65536,"M":65536,"k":16},{"Q":16384,"M":16384,"k":32},{"Q":32768,"M":32768,"k":32},{"Q":65536,"M":65536,"k":32}]'
export VARIANT=knn_bq128_bn64_s1_p4_wg,knn_bq128_bn64_s1_p4_b2_wg
bash "$(dirname "$0")/knn_queue_refit_device.sh" 120 0 || exit 1
ONLY='Q=16384|32768|65536,k=16|32' \
PAT='(bq128_bn64_s1_p4(_b2)?_wg$|bq128_bn64_s1_p2_gn$|bq128_bn32_s1_p3_gn_b2_qs$|bq64_bn64_s1_p2_gn_b4_qs$)' \
FULL=1 exec bash "$(dirname "$0")/knn_percall_sweep_device.sh" "${1:-100}" "${2:-300}"
