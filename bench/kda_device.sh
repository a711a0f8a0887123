#!/bin/bash
# One device call for KDA on a 2-GPU machine (nvidia-h200-x2): GPU 0 runs the GPU tests, the layer
# check and 4 prefill bench shapes; GPU 1 the other 10 (the recurrent prefill kernel is not timed:
# the chunked ones beat it everywhere; the decode bench is bench/kda_decode.py). The fla baseline autotunes
# on every new shape, which is most of the time a shape takes. Results under $OUT/g0, $OUT/g1 (a
# prefill JSON each; bench/merge_prefill.py merges them).
#   bash bench/kda_device.sh [deadline_s]
set -u
export PYTHONUNBUFFERED=1 CAKE_CACHE_DIR=${CAKE_CACHE_DIR:-/tmp/cake}
D=${1:-520}
mkdir -p $OUT/g0 $OUT/g1
(export CUDA_VISIBLE_DEVICES=0
 timeout 170 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_kda_ir.py tests/test_kda_decode_ir.py \
   tests/test_ld_index.py tests/test_mma_chain.py tests/test_kda_chunked.py tests/test_chunk_features.py \
   > $OUT/g0/gpu-tests.log 2>&1
 timeout $((D - 330)) python3 bench/kda_prefill.py --out $OUT/g0 --shapes 0,1,2,3 --variants "" --splits "${KDA_SPLITS:-2x2}" \
   --deadline-s $((D - 380)) > $OUT/g0/prefill.log 2>&1
 timeout $((D - 170 - (D - 330))) python3 bench/kda_layer.py --out $OUT/g0 > $OUT/g0/layer.log 2>&1) &
(export CUDA_VISIBLE_DEVICES=1
 timeout $((D - 10)) python3 bench/kda_prefill.py --out $OUT/g1 --shapes 4,5,6,7,8,9,10,11,12,13 --variants "" --splits "${KDA_SPLITS:-2x2}" \
   --deadline-s $((D - 60)) > $OUT/g1/prefill.log 2>&1) &
wait
tail -3 $OUT/g0/gpu-tests.log; tail -2 $OUT/g0/layer.log
grep -h "^ *[0-9].*|" $OUT/g0/prefill.log $OUT/g1/prefill.log
