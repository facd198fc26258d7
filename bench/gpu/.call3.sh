#!/bin/bash
# session 27 call 3
source bench/gpu/env.sh
nvidia-smi --query-gpu=name --format=csv,noheader
echo "== RowsWritten x50"
timeout 150 cuda_backend_test --gtest_filter='CudaBackend.RowsWritten*' --gtest_repeat=50 > $OUT/test.txt 2>&1; echo rc=$?
grep -cE "^\[       OK \]" $OUT/test.txt; grep -E "FAILED|Failure" $OUT/test.txt | head -5
echo "== bench-step"
timeout 200 drafthead-bench-step --iters=1000 > $OUT/step.txt 2>&1; echo rc=$?
grep -v "level=warn" $OUT/step.txt | sed -n '/pipelined/,$p'
echo "== engine.sh FLAG=cuda-overlap-steps"
timeout 240 env ROUNDS=2 SECS=2 FLAG=cuda-overlap-steps bash bench/gpu/engine.sh > $OUT/engine.txt 2>&1
grep -v "level=warn" $OUT/engine.txt | tail -19
echo "== whole cuda_backend_test x3"
timeout 100 cuda_backend_test --gtest_repeat=3 > $OUT/test_all.txt 2>&1; echo rc=$?
grep -cE "^\[       OK \]" $OUT/test_all.txt; grep -E "FAILED|Failure" $OUT/test_all.txt | head -5
