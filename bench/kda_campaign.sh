#!/bin/bash
# The measured KDA campaigns on a 2-GPU machine (nvidia-h200-x2): `python -m agent.run --task kda`
# once per gate form (shape class), each on its own GPU, from the seed programs; the reports, logs and
# library entries come back under $OUT. GPU 0 then times the prefill shapes named in $1 (if any).
#   bash bench/kda_campaign.sh [shapes]
set -u
export PYTHONUNBUFFERED=1 CAKE_CACHE_DIR=${CAKE_CACHE_DIR:-/tmp/cake}
M=${KDA_CAMPAIGN_MINUTES:-3.5}
run() {   # gate class, GPU
  CUDA_VISIBLE_DEVICES=$2 python3 -m agent.run --task kda --shape SAFE=$1 --budget-minutes $M \
    --max-candidates 12 --deadline 150 --plain --no-vectors --run-id kda-safe$1-h200 > $OUT/campaign-safe$1.log 2>&1
  cp .cake/reports/kda-safe$1-h200.html $OUT/ 2>/dev/null
}
(run 0 0; if [ -n "${1:-}" ]; then mkdir -p $OUT/g0; timeout 200 python3 bench/kda_prefill.py --out $OUT/g0 \
   --shapes $1 --variants "" --deadline-s 150 > $OUT/g0/prefill.log 2>&1; fi) &
(run 1 1) &
wait
tar czf $OUT/kda-library.tgz tasks/kda/library 2>/dev/null   # at most 8 files come back
tail -14 $OUT/campaign-safe0.log $OUT/campaign-safe1.log
grep -h "^ *[0-9].*|" $OUT/g0/prefill.log 2>/dev/null
