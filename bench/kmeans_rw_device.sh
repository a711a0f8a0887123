#!/bin/bash
# One device call, results under $OUT/kmeans:
#   1. GPU tests: wgmma with A from registers / B MN-major against numpy, and every `_rw` k-means variant
#      (the one-hot update on wgmma) against float64; the rest is skipped if any fails;
#   2. a sweep of the `_rw` variants beside the current K >= 100 picks (same run) at those training shapes, joined
#      with the committed sweep (prior rows rescaled) and refitted (-> $D/sweep/kmeans.json);
#   3. the grid shapes whose pick the refit changed, re-timed with the new table (-> $D/grid/).
# The cubins come compiled (CAKE_CACHE_DIR carried).
#     OUT=/some/dir [TESTS=pytest -k expr] [PAT=variant regex] bash bench/kmeans_rw_device.sh [SWEEP_BUDGET_S=150] \
#       [GRID_DEADLINE_S=170]
# (call 4: the defaults; call 6: TESTS="mn2 or rw128" PAT='_rw(128)?$', the m64n128 update beside the m64n64 one)
. "$(dirname "$0")/device_env.sh"
D=$OUT/kmeans; mkdir -p $D
TESTS=${TESTS:-register_a or _rw}
PAT=${PAT:-(resident_k128_bm128_bn64_p(16|33|132)_mma32_wg|resident_k256_bm128_bn64_p(16|33|132)_mma32_wg_rs|_rw)\$}
timeout 150 $PY -m pytest -q -p no:cacheprovider -m gpu tests/test_wgmma_regs.py tests/test_kmeans_wgmma.py \
  -k "$TESTS" > $D/tests.log 2>&1
RC=$?
stamp "tests rc=$RC: $(tail -1 $D/tests.log)"
grep -E "^(FAILED|E  )" $D/tests.log | head -12
[ $RC -ne 0 ] && { stamp "tests failed: no sweep"; exit 0; }
timeout $(( ${1:-150} + 60 )) $PY bench/lib_grid.py sweep --op kmeans --out $D/sweep --procs $NP --budget-s ${1:-150} \
  --only "K=100|128|160|256" \
  --variants "$PAT" --prior bench/results/lib-sweep-kmeans-h200.json > $D/sweep.log 2>&1
stamp "sweep rc=$?"
grep -E "compiled|probe|budget|table|BAD" $D/sweep.log | head -6
$PY - $D/sweep/lib-sweep-h200.json <<'PYEOF'
import json, sys, collections
d = json.load(open(sys.argv[1]))
by = collections.defaultdict(dict)
for r in d["ops"]["kmeans"]["rows"][d.get("prior", {}).get("rows_kept", 0):]:
    if r.get("ok") and r.get("ms"):
        by[json.dumps(r["shape"])][r["variant"]] = r["ms"]
for s, v in by.items():
    a = {k: t for k, t in v.items() if not k.endswith(("_rw", "_rw128"))}    # call 4: the _rs / smem picks
    b = {k: t for k, t in v.items() if k.endswith("_rw")}
    if any(k.endswith("_rw128") for k in v):                                  # call 6: _rw against _rw128
        a, b = b, {k: t for k, t in v.items() if k.endswith("_rw128")}
    if a and b:
        ka, kb = min(a, key=a.get), min(b, key=b.get)
        print(f"{s:36s} {ka:46s} {a[ka]:8.3f} {kb:46s} {b[kb]:8.3f} {a[ka] / b[kb]:.3f}")
PYEOF
regrid_changed kmeans ${2:-170}
tail -2 $D/grid.log
stamp done
