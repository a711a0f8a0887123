#!/bin/bash
# One device call (written in session 21 for the next): the shapes session 21 left, re-swept in one run beside
# the committed table's picks there (a pin needs the pick timed in the same run, cakelib.dispatch.pin), then
# the refit with its pins and all 165 grid shapes in one run:
#   - the k = 16 builds, Q = M = 16384 (a new training shape: the builds' leaf moved it to the capped wgmma
#     kernel, 0.87x of flashlib, where the mma.sync kernel ran 1.13x in session 20) to 65536, with a new
#     mma.sync build at two CTAs per SM (`bq128_bn32_s1_p3_gn_b2_qs`);
#   - the sparse sample (`_sd16` / `_sd32`) at Q = 32-256 with M >= 1M, where session 21 timed it only at
#     Q = 64, M = 4M (1.22-1.28x faster than the every-8th-tile sample there).
# Compile first on the CPU machine (ONLY / PAT below), carry the cache:
#     CAKE_CACHE_DIR=DIR python bench/lib_grid.py compile --op knn --only "$ONLY" --variants "$PAT"
#     OUT=/some/dir CAKE_CACHE_DIR=DIR bash bench/knn_pins_device.sh [SWEEP_BUDGET_S=120] [GRID_DEADLINE_S=300]
export ONLY=${ONLY:-'Q=16384|32768|65536,k=16;Q=32|64|128|256,M=1048576|4194304,k=10|16'}
export PAT=${PAT:-'(bq128_bn64_s128_p4_mw_wg$|bq16_bn32_s128_p4_mw_ws4$|bq64_bn64_s256_p4_mw_wg_ov(_sd32)?$|bq128_bn64_s1_p4_b2_wg$|bq128_bn64_s1_p2_gn$|bq128_bn32_s1_p3_gn_b2_qs$|_s(128|256)_p4_mw_wg(_ov)?_sd(16|32)$)'}
FULL=1 exec bash "$(dirname "$0")/knn_percall_sweep_device.sh" "${1:-120}" "${2:-300}"
