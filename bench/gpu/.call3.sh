#!/bin/bash
source bench/gpu/env.sh; export OUT
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
SECS=1 ROUNDS=2 REPEAT=50 PIECES=3200 timeout 560 bash bench/gpu/lane.sh check breakdown pieces mps 2>&1 | grep -v CudaIPCTypes
