#!/bin/bash
# The measured KDA campaigns on a 2-GPU machine (nvidia-h200-x2): `python -m agent.run --task kda`
# once per gate form (shape class: SAFE=0, then SAFE=1) on GPU 0, from the seed programs; meanwhile
# GPU 1 times the prefill bench shapes named in $1 (bench/kda_prefill.py, two-pass kernels and fla).
# Without $1 the two campaigns run side by side, SAFE=0 on GPU 0 and SAFE=1 on GPU 1
# (KDA_CAMPAIGN_CLASSES="1": only SAFE=1, on GPU 1; KDA_CAMPAIGN_GPU puts every class on that GPU).
# Reports, logs, the library entries (one per timed shape and class; one tarball: at most 8 files come
# back) and the bench JSON go to $OUT. Exit 0 when every campaign printed its end-of-run summary.
#   bash bench/kda_campaign.sh [shapes] [bench deadline s]
set -u
# every candidate is timed on the class's 7 bench shapes (T up to 32768): their inputs and float64
# references take ~20 GB, so the worker's cache must hold them all or each profile job rebuilds them
export PYTHONUNBUFFERED=1 CAKE_CACHE_DIR=${CAKE_CACHE_DIR:-/tmp/cake} CAKE_BENCH_CACHE_GB=${CAKE_BENCH_CACHE_GB:-48}
M=${KDA_CAMPAIGN_MINUTES:-5}
N=${KDA_CAMPAIGN_CANDIDATES:-8}
run() {   # gate class [GPU]
  CUDA_VISIBLE_DEVICES=${2:-0} timeout ${KDA_CAMPAIGN_TIMEOUT:-545} python3 -m agent.run --task kda --shape SAFE=$1 --budget-minutes $M \
    --max-candidates $N --deadline 300 --plain --no-vectors --run-id kda-safe$1-h200 > $OUT/campaign-safe$1.log 2>&1
  cp .cake/reports/kda-safe$1-h200.html $OUT/ 2>/dev/null
}
if [ -z "${1:-}" ]; then      # KDA_CAMPAIGN_CLASSES picks classes (default both); class c runs on GPU c
  for c in ${KDA_CAMPAIGN_CLASSES:-0 1}; do run $c ${KDA_CAMPAIGN_GPU:-$c} & done
else
  (run 0; run 1) &
  (mkdir -p $OUT/g1; CUDA_VISIBLE_DEVICES=1 timeout $((${2:-420} + 40)) python3 bench/kda_prefill.py --out $OUT/g1 \
     --shapes $1 --variants "" --no-chunked --deadline-s ${2:-420} > $OUT/g1/prefill.log 2>&1) &
fi
wait
tar czf $OUT/kda-library.tgz tasks/kda/library 2>/dev/null
ran=0   # each campaign's end-of-run summary (from "== run": best, top candidates, library entries per shape)
for c in ${KDA_CAMPAIGN_CLASSES:-0 1}; do
  f=$OUT/campaign-safe$c.log
  if grep -q "^== run " $f 2>/dev/null; then sed -n '/^== run /,$p' $f; else echo "no summary in $f:"; tail -14 $f 2>/dev/null; ran=1; fi
done
if [ -f $OUT/g1/prefill.log ]; then grep -h "^ *[0-9].*|" $OUT/g1/prefill.log || true; fi   # only with $1 (bench on GPU 1)
echo "library files packed in $OUT/kda-library.tgz:"
ls tasks/kda/library 2>/dev/null || echo "(no tasks/kda/library)"
exit $ran
