#!/bin/bash
# throwaway (untracked): session 15's backend x50 call
set -u
source bench/gpu/env.sh; export OUT
echo "commit $DH_COMMIT"; nvidia-smi --query-gpu=name --format=csv,noheader
t0=$SECONDS
timeout 585 cuda_backend_test --gtest_repeat=50 >$OUT/backend_x50.log 2>&1
echo "[backend x50 rc $? +$((SECONDS-t0)) s]"
grep -c "^\[  PASSED  \]" $OUT/backend_x50.log; grep -E "FAILED|Failure" $OUT/backend_x50.log | sort | uniq -c | head; tail -3 $OUT/backend_x50.log
