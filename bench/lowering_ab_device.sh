#!/bin/bash
# One device call: the lowering's instruction cuts (wgmma descriptors stepped by one add, onehot
# without per-column tests on full fragments, the column bias at constant offsets, one one-hot fragment for
# every held k-means block), results under $OUT/knn:
#   1. the GPU tests of the kernels they touch;
#   2. a same-run A/B of the library at one grid shape per dispatched k-means kernel (and the K = 256 shapes
#      near flashlib) and at five kNN wgmma shapes: the tree before the change (.cake/old, `git archive
#      05ce79b`) and after, old / new / old, baselines timed in every arm (-> $D/ab-{old,new,old2}/).
# Compile both trees' kernels into one cache first (the cache is keyed by source) and carry it:
#     CAKE_CACHE_DIR=DIR python bench/lib_grid.py compile --op kmeans --grid   (and in the old tree, --only the A/B shapes)
#     OUT=/some/dir CAKE_CACHE_DIR=DIR bash bench/lowering_ab_device.sh [TEST_TIMEOUT_S=200] [OLD_TREE=.cake/old]
. "$(dirname "$0")/device_env.sh"
# one grid shape per k-means kernel the table dispatches (the largest it runs), the K = 256 shapes near flashlib,
# and kNN wgmma picks at k = 1 / 16
KM='B=1,N=4194304,K=16;B=1,N=4194304,K=128;B=8,N=262144,K=8;B=8,N=262144,K=128;B=16,N=262144,K=8;'\
'B=16,N=262144,K=256;B=2,N=262144,K=160;B=8,N=262144,K=256;B=1,N=4194304,K=256;B=1,N=2097152,K=256;B=1,N=1048576,K=256'
KN='Q=128,M=4194304,k=1;Q=4096,M=1048576,k=16;Q=65536,M=65536,k=16;Q=4096,M=1048576,k=1;Q=512,M=4194304,k=16'
OLD=${2:-.cake/old}
gpu_tests ${1:-200} tests/test_kmeans_wgmma.py tests/test_onehot.py tests/test_knn_wgmma.py tests/test_cakelib.py
arm() {   # arm NAME TREE
  (cd $2 && PYTHONPATH=/tmp/site:$PWD timeout 200 $PY bench/lib_grid.py grid --op kmeans,knn --out $D/ab-$1 \
     --procs $NP --only "$KM;$KN" > $D/ab-$1.log 2>&1)
  stamp "arm $1 rc=$?"
  grep -E "^(kmeans|knn) \{" $D/ab-$1.log | cut -c1-160
}
arm old $OLD
arm new .
arm old2 $OLD
stamp done
