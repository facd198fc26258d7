#!/bin/bash
# The epilogue's device run (docs/cuda.md round 6; session 16's call, in this form): after
# `source bench/gpu/env.sh`, from the repository root, in one call of the device tool:
#   [REPS=50] [NCU=1] [BACKEND=0] bash bench/gpu/epilogue.sh
# 1. The epilogue tests once (every dispatch against the CPU; a failure shows before the long steps).
# 2. The epilogue table at 64 rows on the full vocabulary and a tp=4 shard: the default dispatch
#    ("new": TOP_K k <= 16 on the group family) beside the split path for every row ("split",
#    variant 6), GPU us behind a GEMV; prints the top-8 points where the default is slower.
# 3. Only if the tests passed: the epilogue tests and cuda_backend_test REPS times each
#    (BACKEND=0: the epilogue tests only; the backend's 50 take ~480 s on an H100).
# NCU=1: ncu (clock control off) on the group family's two kernels at each point of EPI (default
# "top-8 x64"; e.g. EPI='top-8 x1,top-8 x5,top-8 x64'), duration, SpeedOfLight and warp states;
# with OLD=PATH (an older drafthead-bench-cuda) also by that binary, alternating, and a table.
# Every step has a time limit; logs and tables go to $OUT (fetched by the device tool).
set -uo pipefail
out=${OUT:-/tmp/out}
mkdir -p "$out"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv | tee "$out/smi.txt"
step() {  # step NAME LIMIT_S CMD...: runs CMD with a limit, output to $out/NAME.log, rc printed
  local name=$1 limit=$2
  shift 2
  local t0=$SECONDS
  timeout "$limit" "$@" >"$out/$name.log" 2>&1
  rc=$?
  echo "== $name: rc=$rc in $((SECONDS - t0)) s" | tee -a "$out/summary.txt"
  grep -E "PASSED|FAILED|tests ran|Repeating" "$out/$name.log" | sort | uniq -c | tail -6 | tee -a "$out/summary.txt"
}
filter='CudaGemv.ReductionsMatchTheCpuOnGpuLogits:CudaReduce.*'
step epilogue_tests 60 cuda_kernels_test --gtest_filter="$filter"
tests_rc=$rc
step epilogue_table 60 drafthead-bench-cuda --quick --ns=129280,32320 --ms=64
grep -E -A14 "^## N=|epilogue \(M rows\)" "$out/epilogue_table.log" | grep -E "^## N=|^\| (epilogue|full|top|argmax|sample)"
# "new GPU us" is column 12 of a row split at '|', "split GPU us" column 14.
slower=$(grep "^| top-8" "$out/epilogue_table.log" | awk -F'|' '$12 + 0 > $14 + 0 {n++} END {print n + 0}')
echo "top-8 points where the default is slower than the split path: $slower" | tee -a "$out/summary.txt"
if [[ ${NCU:-0} == 1 ]]; then
  # OLD=PATH (another build's drafthead-bench-cuda, e.g. carried in bundle-gpu/old/): each point's
  # kernels by both binaries, alternating old / new twice, durations side by side.
  whos=(new); [[ -n ${OLD:-} ]] && whos=(old new old new)
  IFS=, read -ra epis <<<"${EPI:-top-8 x64}"
  for e in "${epis[@]}"; do
    for ((w = 0; w < ${#whos[@]}; ++w)); do
      who=${whos[$w]} bin=drafthead-bench-cuda
      [[ $who == old ]] && bin=$OLD
      name=ncu_group_${e// /_}_${who}$w
      step "$name" 90 ncu --clock-control none --section SpeedOfLight --section WarpStateStats \
        --section LaunchStats -k regex:Group -c 2 "$bin" --quick --ns=129280 --ms=64 --iters=3 --epi="$e"
      echo "### $e, $who"
      grep -E "Group|Duration|Throughput|Warp Cycles Per Issued|Grid Size" "$out/$name.log" | head -24
    done
  done
  for e in "${epis[@]}"; do  # the duration table
    for ((w = 0; w < ${#whos[@]}; ++w)); do
      awk -v e="$e" -v who="${whos[$w]}" '/GroupScan|GroupMerge/{k=($0 ~ /GroupScan/) ? "scan" : "merge"}
        /Duration/{d[k]=$NF} END{printf "| %s | %s | %s | %s |\n", e, who, d["scan"], d["merge"]}' \
        "$out/ncu_group_${e// /_}_${whos[$w]}$w.log"
    done
  done | { echo "| point | binary | GroupScan us | GroupMerge us |"; echo "| --- | --- | --- | --- |"; cat; }
fi
if [[ $tests_rc == 0 ]]; then
  reps=${REPS:-50}
  step "epilogue_tests_x$reps" 200 cuda_kernels_test --gtest_repeat="$reps" --gtest_brief=1 --gtest_filter="$filter"
  [[ ${BACKEND:-1} == 1 ]] && step "backend_tests_x$reps" 500 cuda_backend_test --gtest_repeat="$reps" --gtest_brief=1
fi
cat "$out/summary.txt"
