#!/bin/bash
# The wide k-means forms on one H200 (~330 s wall by default), results under $OUT/kmeans_diag:
#   1. precompile the GPU tests' and the sweep's kernels (NVRTC, in parallel);
#   2. the GPU tests of tests/test_kmeans_wide.py (float64 Lloyd reference, every form);
#   3. the forms side by side with flashlib (bench/kmeans_wide_sweep.py, each checked first);
#   4. per-kernel GPU time (CUPTI) of one iteration at PARTS_SHAPE (default B = 1, N = 1M, D = 1024, K = 1024), the
#      pick and PARTS_VARIANT (default the TMA form);
#   5. with NCU=1, Nsight Compute on that shape's TMA assignment: stall samples by SASS opcode.
#   TESTS=0 skips step 2; MAX_D=128 sweeps only the shapes with D <= 128.
#     OUT=/some/dir bash bench/kmeans_wide_diag_device.sh [SWEEP_S=180]
set -u
T0=$(date +%s)
SWEEP=${1:-180}
export PYTHONUNBUFFERED=1 CAKE_CACHE_DIR=${CAKE_CACHE_DIR:-/tmp/cake}
PY=${PYTHON:-python3}
NP=$(( $(nproc) > 3 ? $(nproc) - 2 : 1 ))
D=$OUT/kmeans_diag; mkdir -p $D
stamp() { echo "[$(( $(date +%s) - T0 )) s] $*"; }
if [ "${TESTS:-1}" = 1 ]; then
  timeout 90 $PY bench/kmeans_wide_bench.py precompile --tests-only --procs $NP > $D/precompile.log 2>&1
  stamp "precompile rc=$?: $(tail -1 $D/precompile.log)"
  grep "^compile" $D/precompile.log | head -3
fi
timeout 90 $PY bench/kmeans_wide_sweep.py precompile --max-d ${MAX_D:-1024} --procs $NP > $D/precompile-sweep.log 2>&1
stamp "sweep precompile rc=$?: $(tail -1 $D/precompile-sweep.log)"
grep -v ": ok$" $D/precompile-sweep.log | head -3
if [ "${TESTS:-1}" = 1 ]; then
  timeout 150 $PY -m pytest -q -p no:cacheprovider -m gpu tests/test_kmeans_wide.py > $D/pytest.log 2>&1
  stamp "gpu tests rc=$?: $(tail -1 $D/pytest.log)"
  grep -E "^FAILED|Error" $D/pytest.log | head -5
fi
timeout $(( SWEEP + 40 )) $PY bench/kmeans_wide_sweep.py sweep --max-d ${MAX_D:-1024} --out $D/sweep.json --deadline-s $SWEEP > $D/sweep.log 2>&1
stamp "sweep rc=$?"
TMA='{"kind": "wide", "mma": "wgmma", "points": "tma", "dc": 64, "bm": 128, "bn": 256, "stages": 4, "red": 4}'
SHAPE=${PARTS_SHAPE:-1 1048576 1024 1024}
PICK=$($PY -c "import json, sys; from cakelib.variants import kmeans_wide_params as p; B, N, D, K = map(int, sys.argv[1:]); print(json.dumps(p(dict(B=B, N=N, D=D, K=K))))" $SHAPE)
timeout 60 $PY bench/kmeans_wide_parts.py --shape $SHAPE --variant "$PICK" --variant "${PARTS_VARIANT:-$TMA}" \
  --out $D/parts.json 2>&1 | grep -v Warn | tail -4
stamp "parts rc=$?"
if [ "${NCU:-0}" = 1 ]; then
  timeout 150 ncu --clock-control none --set full --import-source no -k regex:'_tma' --launch-skip 1 --launch-count 1 \
    -o $D/assign-tma $PY bench/kmeans_wide_parts.py --shape 1 1048576 1024 1024 --variant "$TMA" --ncu > $D/ncu.log 2>&1
  stamp "ncu rc=$?"
  ncu -i $D/assign-tma.ncu-rep --page source --csv --print-source sass > $D/assign-tma-sass.csv 2> $D/source.err
  ncu -i $D/assign-tma.ncu-rep --page details > $D/assign-tma-details.txt 2>&1
  grep -E "Duration|Compute \(SM\) Throughput|L2 Cache Throughput|Registers Per" $D/assign-tma-details.txt | head -6
  $PY bench/ncu_opcodes.py $D/assign-tma-sass.csv --top 10
  gzip -f $D/assign-tma-sass.csv; rm -f $D/assign-tma.ncu-rep
fi
grep -E "^\(" $D/sweep.log
stamp "done"
