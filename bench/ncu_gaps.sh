#!/bin/bash
# Nsight Compute on the three grid shapes that ran > 5% slower than flashlib (-> $OUT/ncu/):
#   kmeans B = 1, N = 4M, K = 256 (the resident wgmma pick, one Lloyd iteration);
#   knn Q = M = 65536, k = 32: the pick (mma.sync build, queue T = 2) and the wgmma build (T = 2),
#   beside k = 16 on the capped wgmma build (2 CTAs per SM, 2.5x less time per pair).
# Stall reasons, pipe utilization, occupancy and issue rate: where a tile's time goes.
#     OUT=/some/dir CAKE_CACHE_DIR=DIR bash bench/ncu_gaps.sh      (bench/profile_lib.py makes the calls)
NCU="ncu --clock-control none --section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats
 --section SchedulerStats --section ComputeWorkloadAnalysis --section InstructionStats
 --metrics regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio"
mkdir -p $OUT/ncu
timeout 120 $NCU -k regex:'kmeans_resident_k256' --launch-skip 2 --launch-count 1 \
  python3 bench/profile_lib.py kmeans 1 4194304 256 > $OUT/ncu/kmeans-n4m-k256.txt 2>&1; echo "ncu kmeans rc=$?"
timeout 120 $NCU -k regex:'knn_l2_k32' --launch-skip 1 --launch-count 1 \
  python3 bench/profile_lib.py knn 65536 65536 32 > $OUT/ncu/knn-65k-k32-pick.txt 2>&1; echo "ncu knn k32 pick rc=$?"
timeout 120 $NCU -k regex:'knn_l2_k32' --launch-skip 1 --launch-count 1 \
  python3 bench/profile_lib.py knn 65536 65536 32 '{"bq": 128, "bn": 64, "split": 1, "stages": 4, "mma": "wgmma"}' \
  > $OUT/ncu/knn-65k-k32-wg.txt 2>&1; echo "ncu knn k32 wg rc=$?"
timeout 120 $NCU -k regex:'knn_l2_k16' --launch-skip 1 --launch-count 1 \
  python3 bench/profile_lib.py knn 65536 65536 16 > $OUT/ncu/knn-65k-k16-pick.txt 2>&1; echo "ncu knn k16 rc=$?"
grep -E "^  [a-z_]+.*\(|Duration|Registers Per|Achieved Occupancy|Issue Slots Busy|No Eligible|Warp Cycles Per Issued|Compute \(SM\) Throughput|Executed Ipc A|Stall|Pipe|stalled" $OUT/ncu/*.txt | cut -c1-170 | head -120
