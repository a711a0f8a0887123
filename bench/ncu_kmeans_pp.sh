#!/bin/bash
# Nsight Compute on the ping-pong k-means assignment (tasks/kmeans/wide_pingpong.py, the rule's four-warpgroup
# pick) at B = 1, N = 1M, D = 128, K = 4096: the details page (pipe utilization, warp states) and the per-SASS
# stall samples as CSV -> $OUT/ncu/.
#     OUT=/some/dir bash bench/ncu_kmeans_pp.sh
mkdir -p $OUT/ncu
V='{"kind": "wide", "mma": "wgmma", "points": "pingpong", "bm": 256, "bn": 128, "dc": 64, "stages": 8, "red": 4, "copies": 1, "wgs": 4}'
timeout 240 ncu --clock-control none --set full --import-source no -k regex:'kmeans_wide_d128_256x128_s8_pp4' \
  --launch-skip 2 --launch-count 1 -o $OUT/ncu/pp4 python3 bench/profile_lib.py kmeans 1 1048576 4096 "$V" \
  > $OUT/ncu/profile.log 2>&1; echo "ncu rc=$?"; tail -3 $OUT/ncu/profile.log
timeout 60 ncu -i $OUT/ncu/pp4.ncu-rep --page details > $OUT/ncu/pp4-details.txt 2>&1
timeout 60 ncu -i $OUT/ncu/pp4.ncu-rep --page source --csv --print-source sass > $OUT/ncu/pp4-sass.csv 2> $OUT/ncu/source.err
echo "source rc=$? $(wc -l < $OUT/ncu/pp4-sass.csv) lines"
gzip -f $OUT/ncu/pp4-sass.csv; rm -f $OUT/ncu/pp4.ncu-rep
grep -E "Duration|Compute \(SM\) Throughput|Issue Slots Busy|Warp Cycles Per Issued|Tensor|Stall|Active Warps|Registers|Shared Memory Throughput|L2 Cache Throughput|DRAM Throughput|Executed Ipc" $OUT/ncu/pp4-details.txt | head -40
