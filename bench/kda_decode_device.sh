#!/bin/bash
# One device call (one H200, about 120 s wall) for cakelib.kda_decode's pool modes:
# 1. the GPU tests of tests/test_kda_decode_inplace.py for the plan, the vw 8 x vsplit 4 form and the
#    [K, V] layout's lanes-along-V forms (kda_decode_kv, vec 2 and 1 x 8 warps) (in place vs the
#    float64 recurrence, pool of 13 slots for 5 sequences, rows outside idx bit for bit, copying and
#    out= modes, input pool untouched; both layouts and gates; a cols plan for "vk" refused), and
#    tests/test_kda_decode_ir.py's task-interface check of kda_decode_kv through the evaluator;
# 2. bench/kda_decode.py --pool, one process per layout (a faulting kernel loses one layout, not
#    the run): per B in 1..256 at H = HV = 32 (safe gate), every impl checked against the float64 step
#    at the timed shape, then CUDA-event medians, L2 flushed: cakelib in place (plan + variants),
#    cakelib copying, fla's fused_recurrent_kda kernel in place and into a separate pool. Variants:
#    vk: vw x vsplit 8x4 (the plan at 4 < B < 128), 4x8 (B <= 4), 16x2 (B >= 128); kv: 8x4s (the
#    staged form, the earlier plan) and kda_decode_kv cVwWbB (V columns per lane, W warps, B CTAs
#    per SM; the plan c2w8b2, c1w8b4 at B <= 4, c4w8b2 at B >= 128).
# Writes $OUT/kda-decode-pool-{vk,kv}/kda-decode-pool-h200.json, logs under $OUT; prints the tables last.
#   OUT=/path bash bench/kda_decode_device.sh [budget_s]
set -u
export PYTHONUNBUFFERED=1 CAKE_CACHE_DIR=${CAKE_CACHE_DIR:-/tmp/cake}
BUDGET=${1:-120}
T0=$(date +%s)
left() { echo $(( BUDGET - ($(date +%s) - T0) )); }
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,clocks.max.mem --format=csv > "$OUT/gpu.txt" 2>&1
timeout 45 python3 -m pytest -q -p no:cacheprovider tests/test_kda_decode_inplace.py tests/test_kda_decode_ir.py \
  -k "matches and (plan or vw8_vsplit4 or vec2_warps8_blocks2 or vec1_warps8_blocks4 or vec4_warps8_blocks2 or kv_c2w8 or kv_c1w8) or aliasing or refused" \
  > "$OUT/gpu-tests.log" 2>&1
echo "gpu tests rc=$? ($(( $(date +%s) - T0 )) s)" >> "$OUT/gpu-tests.log"
for L in vk kv; do
  if [ "$L" = vk ]; then T=$(( ($(left) - 8) * 9 / 20 )); VARS=8x4,4x8,16x2
  else T=$(( $(left) - 6 )); VARS=8x4s,c2w8b2,c1w8b4,c4w8b2,c2w8b3,c2w16b2; fi
  [ "$T" -lt 10 ] && { echo "no time left for $L" >> "$OUT/pool-$L.log"; continue; }
  mkdir -p "$OUT/kda-decode-pool-$L"
  # the headline batch first: shapes past the deadline are skipped (listed in the JSON), never cut
  timeout $T python3 bench/kda_decode.py --pool --layouts $L --reps 40 --deadline $(( T - 10 )) --pool-variants $VARS \
    --batches 256,1,64,16,128,4,32,2,8 \
    --out "$OUT/kda-decode-pool-$L" > "$OUT/pool-$L.log" 2>&1
  echo "rc=$? ($(( $(date +%s) - T0 )) s)" >> "$OUT/pool-$L.log"
done
tail -2 "$OUT/gpu-tests.log"; grep -E "FAILED|Error" "$OUT/gpu-tests.log" | head -10
for L in vk kv; do
  grep -E "ok=False|Error|Traceback|skipped by deadline" "$OUT/pool-$L.log" | head -8
  sed -n '/^  H lay/,$p' "$OUT/pool-$L.log"
done
