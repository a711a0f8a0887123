#!/bin/bash
# Nsight Compute on the k-means TMA form alone and in CTA pairs (cluster 2, the centroid atoms multicast) at
# B = 1, N = 256K, D = 1024, K = 1024: throughput, occupancy / launch (cluster) and warp-state sections
# -> $OUT/ncu/{tma,cl2}-details.txt, the key lines printed.
#     OUT=/some/dir bash bench/ncu_kmeans_cluster.sh
mkdir -p $OUT/ncu
for form in tma cl2; do
  V='{"kind": "wide", "mma": "wgmma", "points": "tma", "bm": 128, "bn": 256, "dc": 64, "stages": 4, "red": 4, "copies": 1'
  [ $form = cl2 ] && V="$V, \"cluster\": 2"
  KMEANS_D=1024 timeout 150 ncu --clock-control none --section SpeedOfLight --section Occupancy --section LaunchStats \
    --section WarpStateStats --section MemoryWorkloadAnalysis -k regex:'kmeans_wide_d1024_128x256_s4_tma' \
    --launch-skip 2 --launch-count 1 python3 bench/profile_lib.py kmeans 1 262144 1024 "$V}" \
    > $OUT/ncu/$form-details.txt 2>&1; echo "$form ncu rc=$?"
  grep -E "Duration|Compute \(SM\) Throughput|Memory Throughput|L2 Cache Throughput|L1/TEX Cache|Cluster|Achieved Occupancy|Waves Per SM|Stall|Warp Cycles Per Issued|Registers|Grid Size|Max Active Clusters" \
    $OUT/ncu/$form-details.txt | head -24
done
