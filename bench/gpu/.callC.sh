#!/bin/bash
# throwaway (untracked): session 15's kernel x50 + Python under MPS call
set -u
source bench/gpu/env.sh; export OUT
echo "commit $DH_COMMIT"; nvidia-smi --query-gpu=name --format=csv,noheader
t0=$SECONDS
timeout 260 cuda_kernels_test --gtest_repeat=50 --gtest_filter='CudaGemv.EveryMOnTheRealShard:CudaGemv.FullVocabulary:CudaGemv.WgmmaRowsAreBatchInvariant:CudaGemvShapes.FragmentOrderOddShapes:CudaGemvShapes.OddShapesAndMoreThan64Rows:CudaGemvShapes.SubnormalCodesAreExact:CudaGemv.ReductionsMatchTheCpuOnGpuLogits:CudaReduce.*' >$OUT/kernels_x50.log 2>&1
echo "[kernels x50 rc $? +$((SECONDS-t0)) s]"
grep -c "^\[  PASSED  \]" $OUT/kernels_x50.log; grep -E "FAILED|Failure" $OUT/kernels_x50.log | sort | uniq -c | head; tail -2 $OUT/kernels_x50.log
left=$((570 - (SECONDS - t0)))
SECS=1 ROUNDS=1 PIECES=3200 timeout $left bash bench/gpu/lane.sh python pieces mps >$OUT/lane_py.md 2>&1
echo "[python rc $? +$((SECONDS-t0)) s]"; cat $OUT/lane_py.md
