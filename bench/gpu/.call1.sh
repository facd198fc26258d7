#!/bin/bash
# Session 24 call 1: lane GPU tests x50, the breakdown (no MPS, MPS), bench-step.
source bench/gpu/env.sh; export OUT
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
echo "## bundle $DH_COMMIT"
SECS=1 ROUNDS=2 REPEAT=50 timeout 420 bash bench/gpu/lane.sh check breakdown mps 2>&1
echo "## drafthead-bench-step --iters=1000"
timeout 120 drafthead-bench-step --iters=1000 2>&1 | tail -30
