#!/bin/bash
# Issue 12's device run (one call of the device tool; docs/cuda.md "Round 3"): after
# `source bench/gpu/env.sh` (DH_BUNDLE=bundle-gpu12/drafthead-gpu.tar.xz), from the repo root:
#   [KREPS=50] [BREPS=50] [NCU=1] bash bundle-gpu12/kernels.sh [tests50|tests|bench|all]
# tests50: cuda_kernels_test (without the new ring tests) KREPS times and cuda_backend_test BREPS
# times; the ring tests once; then drafthead-bench-cuda: a --quick baseline first (default kernel
# and cuBLAS only, so a failing new variant cannot lose it), then the full table with the ring
# columns; NCU=1: ncu (clock control off) on one launch of the ring (508) and the default kernel.
# Every step has a time limit; logs and tables go to $OUT (fetched by the device tool).
set -uo pipefail
what=${1:-all}
out=${OUT:-/tmp/out}
mkdir -p "$out"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu,power.draw \
  --format=csv | tee "$out/smi.txt"
step() {  # step NAME LIMIT_S CMD...: runs CMD with a limit, output to $out/NAME.log, rc printed
  local name=$1 limit=$2
  shift 2
  local t0=$SECONDS
  timeout "$limit" "$@" >"$out/$name.log" 2>&1
  local rc=$?
  echo "== $name: rc=$rc in $((SECONDS - t0)) s" | tee -a "$out/summary.txt"
  grep -E "PASSED|FAILED|tests ran|Repeating" "$out/$name.log" | sort | uniq -c | tail -6 | tee -a "$out/summary.txt"
}
if [[ $what == all || $what == bench ]]; then
  step bench_base 60 drafthead-bench-cuda --quick --no-epilogue
  cat "$out/bench_base.log"
fi
if [[ $what == all || $what == tests50 || $what == tests ]]; then
  kreps=${KREPS:-50} breps=${BREPS:-50}
  [[ $what == tests ]] && kreps=1 breps=1
  step kernels_test 200 cuda_kernels_test --gtest_repeat=$kreps --gtest_filter=-*TmaRing* --gtest_brief=1
  step backend_test 200 cuda_backend_test --gtest_repeat=$breps --gtest_brief=1
  step ring_test 60 cuda_kernels_test --gtest_filter=*TmaRing*:*Subnormal*
  grep -E "ring:|Failure|Expected|Which is|m=" "$out/ring_test.log" | head -20
fi
if [[ $what == all || $what == bench ]]; then
  step bench 150 drafthead-bench-cuda --no-epilogue
  cat "$out/bench.log"
fi
if [[ ${NCU:-0} == 1 ]]; then
  ncu_args=(--clock-control none --section SpeedOfLight --section MemoryWorkloadAnalysis
            --section WarpStateStats --section SchedulerStats --section Occupancy -c 1)
  # One M = 1 launch each on one shard: 508 is the second ring column (33 launches per column).
  step ncu_ring 90 ncu "${ncu_args[@]}" -k regex:GemvFp8RingKernel --launch-skip 40 \
    drafthead-bench-cuda --ms=1 --ns=32320 --no-epilogue --iters=3
  step ncu_reg 90 ncu "${ncu_args[@]}" -k regex:GemvFp8Kernel --launch-skip 5 \
    drafthead-bench-cuda --ms=1 --ns=32320 --no-epilogue --iters=3 --quick
  for f in ncu_ring ncu_reg; do
    grep -E "Duration|DRAM Throughput|Memory Throughput|Issued Warp|No Eligible|Active Warps|Stall|L2 Hit|Registers" "$out/$f.log" | head -30
  done
fi
cat "$out/summary.txt"
