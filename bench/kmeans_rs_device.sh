#!/bin/bash
# One device call, results under $OUT/kmeans:
#   1. the GPU-marked tests of the register-held k-means sums (every `_rs` variant against float64), the
#      kNN shared bound's tests and the two-stream cakelib test (both not yet run on a GPU);
#   2. a sweep of every wgmma k-means variant (the new `_rs` ones beside the smem-sums ones they replace,
#      same run) at the training shapes, joined with the committed sweep and refitted (-> $D/kmeans.json).
# The cubins come compiled (CAKE_CACHE_DIR carried).
#     OUT=/some/dir bash bench/kmeans_rs_device.sh [SWEEP_BUDGET_S=200]
. "$(dirname "$0")/device_env.sh"
D=$OUT/kmeans; mkdir -p $D
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
timeout 170 $PY -m pytest -q -p no:cacheprovider -m gpu tests/test_kmeans_wgmma.py tests/test_knn_bound.py \
  tests/test_cakelib.py -k "held or bound or stream or wgmma_kmeans" > $D/tests.log 2>&1
stamp "tests rc=$?: $(tail -1 $D/tests.log)"
grep -E "^FAILED|Error" $D/tests.log | head -8
timeout $(( ${1:-200} + 90 )) $PY bench/lib_grid.py sweep --op kmeans --out $D --procs $NP --budget-s ${1:-200} \
  --variants '_wg' --prior bench/results/lib-sweep-kmeans-h200.json > $D/sweep.log 2>&1
stamp "sweep rc=$?"
grep -E "compiled|probe|budget|table|BAD" $D/sweep.log | head -8
$PY - $D/lib-sweep-h200.json <<'PYEOF'
import json, sys, collections
d = json.load(open(sys.argv[1]))
by = collections.defaultdict(dict)
for r in d["ops"]["kmeans"]["rows"][d.get("prior", {}).get("rows_kept", 0):]:
    if r.get("ok") and r.get("ms"):
        by[json.dumps(r["shape"])][r["variant"]] = r["ms"]
print(f"{'shape':36s} {'best smem-sums wg':44s} {'ms':>8s} {'best _rs':44s} {'ms':>8s} ratio")
for s, v in by.items():
    a = {k: t for k, t in v.items() if "_wg" in k and not k.endswith("_rs")}
    b = {k: t for k, t in v.items() if k.endswith("_rs")}
    if a and b:
        ka, kb = min(a, key=a.get), min(b, key=b.get)
        print(f"{s:36s} {ka:44s} {a[ka]:8.3f} {kb:44s} {b[kb]:8.3f} {a[ka] / b[kb]:.3f}")
PYEOF
stamp done
