#!/bin/bash
# One device call (nvidia-h200-x2) that checks what users get from the library and searches the softplus
# gate. GPU 0: GPU tests ($KDA_VALIDATE_TESTS; default the library's: cakelib.kda_prefill with its plan,
# the sequence-parallel plan included, and the 16-bit accumulator store), the serving-level layer check
# through cakelib for each batch in $KDA_VALIDATE_LAYERS ("lens heads;..."; default one per plan kind:
# vs 64, vs 32 with the bulk loader, sequence-parallel), then bench/kda_prefill.py on the bench shapes
# $KDA_VALIDATE_SHAPES (default all 14) and the single sequences $KDA_VALIDATE_EXTRA with the library's
# plan per shape and the points $KDA_VALIDATE_POINTS, fla in the same process. GPU 1 (unless
# KDA_VALIDATE_GPU1=none): the softplus-gate campaign (bench/kda_campaign.sh).
#   bash bench/kda_validate_device.sh      (logs and JSON under $OUT; the defaults, with
#   KDA_VALIDATE_SHAPES unset meaning the extra shapes only)
set -u
export PYTHONUNBUFFERED=1 CAKE_CACHE_DIR=${CAKE_CACHE_DIR:-/tmp/cake}
POINTS=${KDA_VALIDATE_POINTS:-32x2x2x2:bulk,32x1x2x4:bulk,64x1x2x4:bulk,64x1x2x4,128x1x2x8}
EXTRA=${KDA_VALIDATE_EXTRA-32768:8;32768:16}
SHAPES=${KDA_VALIDATE_SHAPES-0,1,2,3,4,5,6,7,8,9,10,11,12,13}
TESTS=${KDA_VALIDATE_TESTS-tests/test_cakelib_kda.py tests/test_acc_store.py tests/test_kda_seq_parallel.py}
LAYERS=${KDA_VALIDATE_LAYERS-37,300,1,64,129 8;300,1000 8;20000 4}
END=${KDA_VALIDATE_SECONDS:-575}
mkdir -p $OUT/g0
(export CUDA_VISIBLE_DEVICES=0
 [ -n "$TESTS" ] && timeout 200 python3 -m pytest -q -m gpu -p no:cacheprovider $TESTS > $OUT/g0/gpu-tests.log 2>&1
 IFS=';' read -ra specs <<< "$LAYERS"
 for spec in "${specs[@]}"; do
   set -- $spec
   timeout 150 python3 bench/kda_layer.py --no-fla --lens $1 --heads $2 --out $OUT/g0/layer-$2x${1//,/-} \
     > $OUT/g0/layer-$2x${1//,/-}.log 2>&1; echo "layer lens $1 heads $2: exit $?" >> $OUT/g0/layer.txt
 done
 left=$((END - SECONDS))
 timeout $left python3 bench/kda_prefill.py --out $OUT/g0 --plan --shapes "$SHAPES" --extra "$EXTRA" --variants "" \
   --no-chunked --two-pass $POINTS --deadline-s $((left - 60)) > $OUT/g0/prefill.log 2>&1) &
if [ "${KDA_VALIDATE_GPU1:-campaign}" != none ]; then
  (KDA_CAMPAIGN_CLASSES=0 KDA_CAMPAIGN_GPU=1 KDA_CAMPAIGN_MINUTES=${KDA_CAMPAIGN_MINUTES:-8.3} \
     KDA_CAMPAIGN_TIMEOUT=${KDA_CAMPAIGN_TIMEOUT:-570} bash bench/kda_campaign.sh > $OUT/campaign.txt 2>&1) &
fi
wait
tar czf $OUT/kda-validate.tgz -C $OUT g0
[ -f $OUT/g0/gpu-tests.log ] && { tail -3 $OUT/g0/gpu-tests.log; grep -E "^FAILED|^ERROR" $OUT/g0/gpu-tests.log | head -20; }
[ -f $OUT/g0/layer.txt ] && { cat $OUT/g0/layer.txt; grep -h "PASS\|FAIL" $OUT/g0/layer-*.log; }
grep -h "^ *[0-9].*|\|geomean" $OUT/g0/prefill.log
[ -f $OUT/campaign.txt ] && cat $OUT/campaign.txt
exit 0
