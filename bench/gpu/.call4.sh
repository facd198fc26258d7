#!/bin/bash
# session 27 call 4
source bench/gpu/env.sh
nvidia-smi --query-gpu=name --format=csv,noheader
echo "== engine.sh FLAG=cuda-overlap-steps, c=64 points, 3 rounds"
timeout 200 env ROUNDS=3 SECS=2 POINTS='c=64' FLAG=cuda-overlap-steps bash bench/gpu/engine.sh > $OUT/engine.txt 2>&1
grep -v "level=warn" $OUT/engine.txt | grep -E "c=64|Medians|^\| point|^\| ---"
echo "== RowsWritten x50"
timeout 230 cuda_backend_test --gtest_filter='CudaBackend.RowsWritten*' --gtest_repeat=50 > $OUT/test.txt 2>&1; echo rc=$?
grep -cE "^\[       OK \]" $OUT/test.txt; grep -E "FAILED|Failure" $OUT/test.txt | head -5
