#!/bin/bash
# Nsight Compute, source level, on the one k-means grid shape still > 5% slower than flashlib (B = 1, N = 4M,
# K = 256, the resident wgmma pick): the full section set exported, then the per-SASS-instruction
# stall samples as CSV (where the 5.13 cycles per issued instruction go) -> $OUT/ncu/.
#     OUT=/some/dir CAKE_CACHE_DIR=DIR bash bench/ncu_kmeans_source.sh
mkdir -p $OUT/ncu
timeout 200 ncu --clock-control none --set full --import-source no -k regex:'kmeans_resident_k256' --launch-skip 2 \
  --launch-count 1 -o $OUT/ncu/kmeans-n4m-k256 python3 bench/profile_lib.py kmeans 1 4194304 256 \
  > $OUT/ncu/profile.log 2>&1; echo "ncu rc=$?"
timeout 60 ncu -i $OUT/ncu/kmeans-n4m-k256.ncu-rep --page source --csv --print-source sass \
  > $OUT/ncu/kmeans-n4m-k256-sass.csv 2> $OUT/ncu/source.err; echo "source rc=$? $(wc -l < $OUT/ncu/kmeans-n4m-k256-sass.csv) lines"
timeout 60 ncu -i $OUT/ncu/kmeans-n4m-k256.ncu-rep --page details > $OUT/ncu/kmeans-n4m-k256-details.txt 2>&1
head -c 600 $OUT/ncu/source.err
head -3 $OUT/ncu/kmeans-n4m-k256-sass.csv | cut -c1-400
gzip -f $OUT/ncu/kmeans-n4m-k256-sass.csv; rm -f $OUT/ncu/kmeans-n4m-k256.ncu-rep
