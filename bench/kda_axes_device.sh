#!/bin/bash
# One device call (nvidia-h200-x2) for the two-pass search axes. GPU 0: the GPU tests of the
# sequence-parallel programs and the two-pass points not yet run on the GPU (bulk loader, vs 128 c8),
# then bench/kda_prefill.py on the shapes in $1 for the axes' points, fla timed in the same process.
# GPU 1: the campaign of gate class $2 (bench/kda_campaign.sh, KDA_CAMPAIGN_CLASSES=$2, on GPU 1 whatever
# the class: class 0 on GPU 0 beside the tests and the bench once spoilt both timings). Logs and JSON under
# $OUT (g0/ packed in kda-axes.tgz).
#   bash bench/kda_axes_device.sh [shapes] [campaign class]   (env: KDA_AXES_POINTS, KDA_AXES_TESTS, KDA_AXES_EXTRA)
set -u
export PYTHONUNBUFFERED=1 CAKE_CACHE_DIR=${CAKE_CACHE_DIR:-/tmp/cake}
SHAPES=${1:-6,7,0,1}
POINTS=${KDA_AXES_POINTS:-32x1x2x4,32x1x2x4:bulk,128x1x2x8:bulk,32x1x2x4x64,64x1x2x4x32,64x1x2x4x64,128x1x2x8x32,128x1x2x8x64}
TESTS=${KDA_TESTS:-200}
# pytest selection (KDA_AXES_TESTS), extra single-sequence shapes (KDA_AXES_EXTRA, bench/kda_prefill.py --extra)
SEL=${KDA_AXES_TESTS:-tests/test_kda_seq_parallel.py tests/test_program.py tests/test_kda_two_pass.py -k "seq_parallel or program or copybulk or consumers8"}
mkdir -p $OUT/g0
(export CUDA_VISIBLE_DEVICES=0
 eval timeout $TESTS python3 -m pytest -q -m gpu -p no:cacheprovider $SEL > $OUT/g0/gpu-tests.log 2>&1
 timeout $((560 - TESTS)) python3 bench/kda_prefill.py --out $OUT/g0 --shapes "$SHAPES" --extra "${KDA_AXES_EXTRA:-}" \
   --variants "" --no-chunked --two-pass $POINTS --deadline-s $((520 - TESTS)) > $OUT/g0/prefill.log 2>&1) &
if [ -n "${2:-}" ]; then
  (KDA_CAMPAIGN_CLASSES=$2 KDA_CAMPAIGN_GPU=1 KDA_CAMPAIGN_MINUTES=${KDA_CAMPAIGN_MINUTES:-7.5} KDA_CAMPAIGN_TIMEOUT=${KDA_CAMPAIGN_TIMEOUT:-555} \
     bash bench/kda_campaign.sh > $OUT/campaign.txt 2>&1) &
fi
wait
tar czf $OUT/kda-axes.tgz -C $OUT g0
tail -3 $OUT/g0/gpu-tests.log; grep -E "^FAILED|^ERROR" $OUT/g0/gpu-tests.log | head -20
grep -h "^ *[0-9].*|\|geomean" $OUT/g0/prefill.log
[ -f $OUT/campaign.txt ] && cat $OUT/campaign.txt
exit 0
