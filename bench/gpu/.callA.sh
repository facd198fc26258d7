#!/bin/bash
# throwaway (untracked): session 15's first device call
set -u
source bench/gpu/env.sh; export OUT
echo "commit $DH_COMMIT"; nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
t0=$SECONDS
timeout 220 drafthead-bench-cuda --no-epilogue --variants=771,801,820,821,822 --ms=1,5,16,17,32,48,64 >$OUT/gemv_variants.md 2>&1
echo "[bench rc $? +$((SECONDS-t0)) s]"; cat $OUT/gemv_variants.md | grep -v "^$" | head -60
timeout 60 cuda_kernels_test --gtest_filter='CudaGemv.Wgmma*:CudaGemv.Reductions*:CudaReduce.*' >$OUT/kt_wgmma.log 2>&1
echo "[wgmma tests rc $? +$((SECONDS-t0)) s]"; grep -E "^\[  (PASSED|FAILED) |FAILED" $OUT/kt_wgmma.log | head
timeout 60 drafthead-bench-cuda --quick --ns=129280 --ms=64 >$OUT/epilogue.md 2>&1
echo "[epilogue rc $? +$((SECONDS-t0)) s]"; grep -A14 "epilogue (M rows)" $OUT/epilogue.md
timeout 90 ncu --clock-control none --section SpeedOfLight --section Occupancy --section WarpStateStats --section LaunchStats --section SchedulerStats --section MemoryWorkloadAnalysis -k regex:Split -c 2 drafthead-bench-cuda --quick --ns=129280 --ms=64 --iters=3 --epi="top-8 x64" >$OUT/ncu_split_x64.txt 2>&1
echo "[ncu rc $? +$((SECONDS-t0)) s]"; grep -E "Split|Duration|Throughput|Registers|Achieved Occ|Theoretical Occ|Block Limit|No Eligible|Active Warps|Eligible Warps|Warp Cycles Per Issued|Dynamic Shared|Static Shared|top-8 x64" $OUT/ncu_split_x64.txt | head -60
timeout 60 ncu --clock-control none --section SpeedOfLight --section Occupancy --section WarpStateStats --section LaunchStats -k regex:Group -c 2 drafthead-bench-cuda --quick --ns=129280 --ms=64 --iters=3 --epi="top-8 x64" >$OUT/ncu_group_x64.txt 2>&1
echo "[ncu group rc $? +$((SECONDS-t0)) s]"; grep -E "Group|Duration|Throughput|Registers|Achieved Occ|No Eligible" $OUT/ncu_group_x64.txt | head -24
SECS=2 ROUNDS=1 timeout 200 bash bench/gpu/lane.sh cpp pieces >$OUT/lane.md 2>&1
echo "[lane rc $? +$((SECONDS-t0)) s]"; cat $OUT/lane.md
left=$((560 - (SECONDS - t0)))
if [ $left -gt 90 ]; then
  ROUNDS=1 SECS=2 timeout $left bash bench/gpu/engine.sh >$OUT/engine.md 2>&1
  echo "[engine rc $? +$((SECONDS-t0)) s]"; tail -40 $OUT/engine.md
fi
