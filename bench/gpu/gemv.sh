#!/bin/bash
# The fp8 GEMV's device run (docs/cuda.md, rounds 3-4): after `source bench/gpu/env.sh`, from the
# repository root, in one call of the device tool:
#   [KREPS=50] [BREPS=50] [NEW='*FragmentOrder*'] [NCU=1] [OLD=PATH] bash bench/gpu/gemv.sh [tests50|tests|new|bench|ab|round7|stalls|sass|all]...
# new: the tests matching $NEW once (the new kernels' tests, run first so a failure shows before
# the long steps); tests50: cuda_kernels_test KREPS times and cuda_backend_test BREPS times (tests:
# once each); bench: drafthead-bench-cuda, a --quick baseline first (the default kernel and cuBLAS
# only, so a failing variant cannot lose it), then the full table; NCU=1: ncu (clock control off)
# on one M = 1 launch on one shard of the production kernel and of the row-major one.
# round7: the wgmma variants 830-837 (docs/cuda.md round 7) by ncu and by the bench.
# stalls: ncu's sections and stall reasons for one M = 64 launch on one shard of production's wgmma
# kernel (8 warps x 2 tiles) and of round 7's 835 (16 x 1): what their warps wait on.
# sass: the production kernels' SASS (the server binary holds no experiment), each with its opcode
# counts, and ncu's per-instruction stall samples of one M = 64 launch of production's wgmma kernel
# (CSV): read afterwards off the device (this machine's toolkit has no cuobjdump / nvdisasm).
# ab: OLD=PATH (another build's drafthead-bench-cuda, e.g. carried in bundle-gpu/old/): the quick
# GEMV table (production and cuBLAS, M = 1, 16, 17, 32, 33, 64, full vocabulary and a tp=4 shard)
# by the old binary and this bundle's, alternated old / new / old / new on the one warm GPU.
# Every step has a time limit; logs and tables go to $OUT (fetched by the device tool).
set -uo pipefail
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
for what in "${@:-all}"; do
  if [[ $what == new ]]; then
    step new_tests 240 cuda_kernels_test --gtest_filter="${NEW:-*FragmentOrder*}"
    grep -E "fragment order:|wgmma:|Failure|Expected|Which is|m=" "$out/new_tests.log" | head -30
  fi
  if [[ $what == round7 ]]; then
    # docs/cuda.md round 7's table: each wgmma launch of the bit-for-bit test timed by ncu (one
    # launch each, caches flushed; how session 28's figures were made), then the bench's columns.
    step round7_ncu 120 ncu --clock-control none --metrics gpu__time_duration.sum -k regex:Wgmma --csv \
      cuda_kernels_test --gtest_filter='CudaGemv.OneTile*'
    step round7_bench 200 drafthead-bench-cuda --no-epilogue --variants=801,830,831,832,833,834,835,836,837 \
      --ms=1,5,16,17,32,48,64
    cat "$out/round7_bench.log"
  fi
  if [[ $what == stalls ]]; then
    # One M = 64 launch of each kernel (picked by its demangled template arguments: W warps, RT
    # tiles), its sections and the stall reasons a issued instruction, instructions, warps
    # active / eligible (how session 29's table in docs/cuda.md round 7 was made).
    for kern in 'production|\(int\)8, \(int\)2>' '835|\(int\)16, \(int\)1>'; do
      step "stalls_${kern%%|*}" 120 ncu --clock-control none --kernel-name-base demangled -k "regex:${kern#*|}" -c 1 \
        --section SpeedOfLight --section Occupancy --section WarpStateStats --section SchedulerStats \
        --section MemoryWorkloadAnalysis --metrics 'regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio,smsp__inst_executed.sum' \
        drafthead-bench-cuda --no-epilogue --variants=835 --ms=64 --ns=32320 --iters=3
      echo "### ${kern%%|*}"
      grep -E "GemvFp8Wgmma|Duration|DRAM Throughput|L2 Cache Throughput|Issued Warp|No Eligible|Active Warps Per S|Eligible Warps|inst_executed|stalled" \
        "$out/stalls_${kern%%|*}.log" | awk '!/stalled/ || $NF + 0 >= 0.05' | cut -c1-150
    done
  fi
  if [[ $what == sass ]]; then
    cuobjdump=/usr/local/cuda/bin/cuobjdump
    step sass_dump 120 "$cuobjdump" -sass "$DH/bin/server/drafthead-server"
    # One file a kernel (by its mangled name's template: Function : NAME), and its opcode counts.
    awk -v dir="$out" '/Function : /{f = dir "/sass_" (++n) ".txt"; print $0 > f; print n, $3 >> (dir "/sass_index.txt"); next}
      f {print > f}' "$out/sass_dump.log"
    for f in "$out"/sass_[0-9]*.txt; do
      echo "### $(head -1 "$f" | cut -c1-160)"
      grep -oE '^ +/\*[0-9a-f]{4,}\*/ +(@!?U?P[0-9T] +)?[A-Z][A-Z0-9_.]*' "$f" | awk '{print $NF}' | sed 's/\..*//' \
        | sort | uniq -c | sort -rn | head -12 | tr '\n' ' '
      echo
    done > "$out/sass_opcodes.txt"
    rm -f "$out/sass_dump.log"
    step sass_stalls 150 ncu --clock-control none --kernel-name-base demangled -k 'regex:\(int\)8, \(int\)2>' -c 1 \
      --section SourceCounters --section WarpStateStats --warp-sampling-interval 0 --page source --print-source sass --csv \
      drafthead-bench-cuda --quick --no-epilogue --ms=64 --ns=32320 --iters=3
    wc -l "$out/sass_index.txt" "$out/sass_stalls.log"; head -c 600 "$out/sass_opcodes.txt"
    # One archive back (the device tool returns a bounded number of files).
    (cd "$out" && tar -cJf sass.tar.xz sass_[0-9]*.txt sass_index.txt sass_opcodes.txt sass_stalls.log && rm -f sass_[0-9]*.txt)
  fi
  if [[ $what == ab ]]; then
    for who in old new old new; do
      bin=drafthead-bench-cuda; [[ $who == old ]] && bin=${OLD:?ab needs OLD=PATH}
      step "ab_$who" 60 "$bin" --quick --no-epilogue --ms=1,16,17,32,33,64 --ns=129280,32320
      echo "### GEMV table, $who"
      grep -E "^## N=|^\| [0-9]|streaming" "$out/ab_$who.log"
    done
  fi
  if [[ $what == all || $what == bench ]]; then
    step bench_base 60 drafthead-bench-cuda --quick --no-epilogue
    cat "$out/bench_base.log"
  fi
  if [[ $what == all || $what == tests50 || $what == tests ]]; then
    kreps=${KREPS:-50} breps=${BREPS:-50}
    [[ $what == tests ]] && kreps=1 breps=1
    [[ $kreps -gt 0 ]] && step kernels_test 400 cuda_kernels_test --gtest_repeat=$kreps --gtest_brief=1
    [[ $breps -gt 0 ]] && step backend_test 400 cuda_backend_test --gtest_repeat=$breps --gtest_brief=1
  fi
  if [[ $what == all || $what == bench ]]; then
    step bench 200 drafthead-bench-cuda --no-epilogue
    cat "$out/bench.log"
  fi
done
if [[ ${NCU:-0} == 1 ]]; then
  ncu_args=(--clock-control none --section SpeedOfLight --section MemoryWorkloadAnalysis
            --section WarpStateStats --section SchedulerStats --section Occupancy -c 1)
  # One M = 1 launch on one shard: the production kernel (--quick: its first launches after the
  # warm-up), then the row-major kernel of rounds 1-3 (the first column; 33 launches a column at
  # --iters=3).
  step ncu_prod 120 ncu "${ncu_args[@]}" -k regex:GemvFp8Kernel --launch-skip 5 \
    drafthead-bench-cuda --ms=1 --ns=32320 --no-epilogue --iters=3 --quick
  step ncu_rowmajor 120 ncu "${ncu_args[@]}" -k regex:GemvFp8Kernel --launch-skip $((33 + 5)) \
    drafthead-bench-cuda --ms=1 --ns=32320 --no-epilogue --iters=3
  for f in ncu_prod ncu_rowmajor; do
    echo "== $f"
    grep -E "GemvFp8Kernel|Duration|DRAM Throughput|Memory Throughput|L2 Cache Throughput|Issued Warp|No Eligible|Active Warps|L2 Hit|Registers" "$out/$f.log" | head -30
  done
fi
cat "$out/summary.txt"
