#!/bin/bash
# Nsight Compute on the kNN picks where k = 16 loses: the Q = 64, M = 4M search kernel (latency
# with one CTA per SM?) and the Q = 1, M = 100K stream at k = 16 against k = 10 (the insertions) -> $OUT/ncu/.
#     OUT=/some/dir bash bench/ncu_knn_k16.sh      (on the GPU machine; bench/profile_lib.py makes the calls)
NCU="ncu --clock-control none --section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats --section SchedulerStats --section MemoryWorkloadAnalysis"
mkdir -p $OUT/ncu
timeout 100 $NCU -k regex:'knn_l2_k16_d128_128x64_wg.*sd8' --launch-skip 1 --launch-count 1 python3 bench/profile_lib.py knn 64 4194304 16 > $OUT/ncu/q64-m4m-k16.txt 2>&1; echo "ncu1 rc=$?"
timeout 100 $NCU -k regex:'knn_l2_k16_d128_16x32' --launch-skip 1 --launch-count 1 python3 bench/profile_lib.py knn 1 100000 16 > $OUT/ncu/q1-m100k-k16.txt 2>&1; echo "ncu2 rc=$?"
timeout 100 $NCU -k regex:'knn_l2_k10_d128_16x32' --launch-skip 1 --launch-count 1 python3 bench/profile_lib.py knn 1 100000 10 > $OUT/ncu/q1-m100k-k10.txt 2>&1; echo "ncu3 rc=$?"
grep -E "Duration|Registers|Achieved Occupancy|Issue Slots Busy|No Eligible|Warp Cycles Per Issued|Compute \(SM\) Throughput|Memory Throughput|Executed Ipc A" $OUT/ncu/*.txt | cut -c1-150
