#!/bin/bash
# One device call for KDA on a 2-GPU machine (nvidia-h200-x2): GPU 0 runs the GPU tests, 4 prefill
# bench shapes and the layer check; GPU 1 the other 10 shapes (the recurrent prefill kernel is not
# timed: the chunked ones beat it everywhere; the decode bench is bench/kda_decode.py). The fla baseline
# autotunes on every new shape, which is most of the time a shape takes. Everything under $OUT/g0,
# $OUT/g1 is also packed into $OUT/kda-device.tgz (the device returns at most 8 files); a prefill JSON
# per GPU, merged by bench/merge_prefill.py.
#   bash bench/kda_device.sh [deadline_s]      (KDA_SPLITS: single-kernel split points, default 2x2)
set -u
export PYTHONUNBUFFERED=1 CAKE_CACHE_DIR=${CAKE_CACHE_DIR:-/tmp/cake}
D=${1:-580}
TESTS=${KDA_TESTS:-240}
mkdir -p $OUT/g0 $OUT/g1
(export CUDA_VISIBLE_DEVICES=0
 timeout $TESTS python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_kda_two_pass.py tests/test_program.py \
   tests/test_cakelib_kda.py tests/test_kda_chunked.py tests/test_kda_ir.py tests/test_kda_decode_ir.py \
   tests/test_ld_index.py tests/test_mma_chain.py tests/test_chunk_features.py > $OUT/g0/gpu-tests.log 2>&1
 timeout $((D - TESTS - 130)) python3 bench/kda_prefill.py --out $OUT/g0 --shapes 0,1,2,3 --variants "" \
   --splits "${KDA_SPLITS:-2x2}" --deadline-s $((D - TESTS - 190)) > $OUT/g0/prefill.log 2>&1
 timeout 120 python3 bench/kda_layer.py --out $OUT/g0 > $OUT/g0/layer.log 2>&1) &
(export CUDA_VISIBLE_DEVICES=1
 timeout $((D - 10)) python3 bench/kda_prefill.py --out $OUT/g1 --shapes 4,5,6,7,8,9,10,11,12,13 --variants "" \
   --splits "${KDA_SPLITS:-2x2}" --deadline-s $((D - 60)) > $OUT/g1/prefill.log 2>&1) &
wait
tar czf $OUT/kda-device.tgz -C $OUT g0 g1
tail -3 $OUT/g0/gpu-tests.log; grep -E "FAILED|Error" $OUT/g0/gpu-tests.log | head -20; tail -2 $OUT/g0/layer.log
grep -h "^ *[0-9].*|\|geomean" $OUT/g0/prefill.log $OUT/g1/prefill.log
