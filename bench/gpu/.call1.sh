#!/bin/bash
# session 27 call 1
source bench/gpu/env.sh
nvidia-smi --query-gpu=name --format=csv,noheader
echo "== backend test (stage events off ways), x20"
timeout 120 cuda_backend_test --gtest_filter='CudaBackend.RowsWritten*' --gtest_repeat=20 2>&1 | grep -E "PASSED|FAILED|tests ran" | sort | uniq -c
echo "== bench-step"
timeout 200 drafthead-bench-step --iters=1000 2>&1
echo "== engine.sh FLAG=cuda-stage-events"
timeout 240 env ROUNDS=2 SECS=2 FLAG=cuda-stage-events bash bench/gpu/engine.sh 2>&1 | tail -40
