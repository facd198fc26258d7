#!/bin/bash
# session 27 call 2
source bench/gpu/env.sh
nvidia-smi --query-gpu=name --format=csv,noheader
echo "== backend test (stage events off ways), x20"
timeout 150 cuda_backend_test --gtest_filter='CudaBackend.RowsWritten*' --gtest_repeat=20 > $OUT/test.txt 2>&1; echo rc=$?
grep -cE "^\[       OK \]" $OUT/test.txt; grep -E "FAILED|Failure" $OUT/test.txt | head -5
echo "== bench-step"
timeout 200 drafthead-bench-step --iters=1000 > $OUT/step.txt 2>&1; echo rc=$?
grep -v "level=warn" $OUT/step.txt
echo "== engine.sh FLAG=cuda-stage-events"
timeout 240 env ROUNDS=2 SECS=2 FLAG=cuda-stage-events bash bench/gpu/engine.sh > $OUT/engine.txt 2>&1
grep -v "level=warn" $OUT/engine.txt | tail -22
