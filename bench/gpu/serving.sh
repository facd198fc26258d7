#!/bin/bash
# Everything the GPU tables in docs/ are made with, in one device command (< 10 minutes on one
# H200). Here: `bench/gpu/bundle.sh` (builds the CUDA tree, packs it into bundle-gpu/). On the GPU
# machine, from the repository root (the device tool's `carry: ["bundle-gpu"]`):
#
#   bash bench/gpu/serving.sh [all | tests | bench | serve | python]...   (default: all)
#
# bench:  drafthead-bench-cuda --quick at N = 129280 (full vocabulary) and 32320 (one tp=4 shard)
# serve:  the end-to-end table of issue 11: tp=1 --comm=nccl, full vocabulary, synthetic weights,
#         c=1: M=5 TOP_K k=8 unary and stream, M=1 ARGMAX, M=5 FULL_LOGITS bf16; c=64 M=5 TOP_K;
#         then tp=4 --comm=gloo on the one GPU (c=1 and c=64). The GEMV time of each point is the
#         server's own (Timing.gemv_us, device events around the kernel in the same run), and the
#         M=64 GEMV for the c=64 bound comes from `bench`.
# kserve: issue 14's table: native vs KServe v2 (--protocol=kserve) on the tp=1 server, M=5 TOP_K
#         k=8, unary and stream, c=1, alternating runs (ROUNDS, default 3); ratio of median p50s.
# python: bench/python_client_bench.py against the tp=1 server, torch CUDA tensors and numpy.
# tests:  every GPU test binary (label cuda) with --gtest_repeat=50, run at once, each bounded by
#         TEST_TIMEOUT (last: a slow test run cannot cost the tables above); logs to $OUT if set.
# Prints Markdown tables; SECS (default 4) sets the measured seconds per point, TEST_TIMEOUT (default
# 180) the seconds per test binary (50 repeats; rerun `tests` alone with more if one times out).
set -uo pipefail
cd "$(dirname "$0")/../.."
source bench/gpu/env.sh
srv=$DH/bin/server/drafthead-server
cli=$DH/bin/client/drafthead-client
secs=${SECS:-4}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
source bench/serving_lib.sh
phases=("$@")
[ ${#phases[@]} -eq 0 ] && phases=(all)
want() { [[ " ${phases[*]} " == *" all "* || " ${phases[*]} " == *" $1 "* ]]; }
t_start=$SECONDS
stamp() { echo "[$1 done at +$((SECONDS - t_start)) s]"; }

echo "# date: $(date -u '+%F %H:%M UTC'), $(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | head -1)"
echo "# commit: $(git rev-parse --short HEAD 2>/dev/null || echo unknown)"

gemv64=""
if want bench; then
  echo; echo "## drafthead-bench-cuda --quick (M = 1, 5, 64)"
  timeout 90 "$DH/bin/bench/drafthead-bench-cuda" --quick --ms=1,5,64 --ns=129280,32320 | tee "$tmp/bench.txt"
  # The fp8 column of the M = 64 row under the full-vocabulary header.
  gemv64=$(awk '/^## N=129280 /{on=1} on && /^\| 64 \|/{print $4; exit}' "$tmp/bench.txt")
  stamp bench
fi

# check LABEL BOUND JSON: one point against issue 11's targets (p50 <= GEMV + BOUND, GEMV from the
# same point; compute <= GEMV + 25; queue <= 10; for topk_unary also p99 <= p50 + 100).
check() {
  python3 - "$@" <<'PY'
import json, sys
label, bound_add = sys.argv[1], float(sys.argv[2])
r = json.load(open(sys.argv[3]))['runs'][0]
gemv = r['server_stages_us']['gemv']['p50']
p50, p99 = r['latency_us']['p50'], r['latency_us']['p99']
comp, queue = r['server_us']['compute']['p50'], r['server_us']['queue']['p50']
ok = lambda c: 'met' if c else 'MISSED'
p99_note = f" (<= p50 + 100: {ok(p99 <= p50 + 100)})" if label == 'topk_unary' else ''
print(f"| {label} | {gemv:.0f} | {p50:.0f} | GEMV + {bound_add:.0f} = {gemv + bound_add:.0f}: {ok(p50 <= gemv + bound_add)} "
      f"| {p99:.0f}{p99_note} | {comp:.0f} (<= GEMV + 25: {ok(comp <= gemv + 25)}) | {queue:.0f} (<= 10: {ok(queue <= 10)}) |")
PY
}

if want serve || want python || want kserve; then
  echo; echo "## tp=1 --comm=nccl, full vocabulary, synthetic weights"
  if serve "$srv" "$tmp/tp1.log" --tp=1 --backend=cuda --comm=nccl --synthetic=1; then
    if want serve; then
      point_header
      declare -A bounds=([topk_unary]=70 [topk_stream]=50 [argmax]=60 [full]=400)
      point "c=1 M=5 TOP_K k=8 unary" --rows=5 --mode=topk --k=8 --duration=${secs}s
      cp "$tmp/point.json" "$tmp/topk_unary.json"
      point "c=1 M=5 TOP_K k=8 stream" --rows=5 --mode=topk --k=8 --stream --duration=${secs}s
      cp "$tmp/point.json" "$tmp/topk_stream.json"
      point "c=1 M=1 ARGMAX unary" --rows=1 --mode=argmax --duration=${secs}s
      cp "$tmp/point.json" "$tmp/argmax.json"
      point "c=1 M=5 FULL_LOGITS bf16 unary" --rows=5 --mode=full --dtype=bf16 --duration=${secs}s
      cp "$tmp/point.json" "$tmp/full.json"
      point "c=64 M=5 TOP_K k=8 unary" --rows=5 --mode=topk --k=8 --concurrency=64 --connections=4 --duration=${secs}s
      cp "$tmp/point.json" "$tmp/c64.json"
      echo; echo "### Targets (GEMV = the server's gemv_us p50 in the same point)"
      echo "| point | GEMV us | p50 us | p50 bound | p99 us | compute p50 us | queue p50 us |"
      echo "| --- | --- | --- | --- | --- | --- | --- |"
      for p in topk_unary topk_stream argmax full; do check "$p" "${bounds[$p]}" "$tmp/$p.json"; done
      python3 - "$tmp/c64.json" "${gemv64:-}" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))['runs'][0]
g = float(sys.argv[2]) if sys.argv[2] else None
bound = 0.85 * 64 / (g * 1e-6) if g else None
verdict = ('met' if r['rows_per_s'] >= bound and r['errors'] == 0 else 'MISSED') if bound else 'no M=64 GEMV (run bench)'
print(f"\nc=64: {r['rows_per_s']:.0f} rows/s, {r['errors']} errors, batch_rows p50 {r['batch_rows_p50']}; "
      f"85% of 64 / GEMV(M=64 = {g} us) = {bound and round(bound)} rows/s: {verdict}")
PY
    fi
    if want kserve; then
      echo; echo "### Native vs KServe v2, c=1, M=5 TOP_K k=8, alternating runs of ${secs} s"
      point_header
      for ((r = 0; r < ${ROUNDS:-3}; ++r)); do
        for call in unary stream; do
          s=""; [ $call = stream ] && s="--stream"
          for proto in native kserve; do
            point "$proto $call (round $r)" --protocol=$proto --rows=5 --mode=topk --k=8 $s --duration=${secs}s
            echo "$proto $call $p50" >>"$tmp/kserve.txt"
          done
        done
      done
      python3 - "$tmp/kserve.txt" <<'PY'
import statistics, sys
p = {}
for line in open(sys.argv[1]):
    proto, call, v = line.split()
    p.setdefault((proto, call), []).append(float(v))
print("\n| call | native p50 us (median) | KServe p50 us (median) | KServe / native | target <= 1.10 |")
print("| --- | --- | --- | --- | --- |")
for call in ("unary", "stream"):
    a, b = statistics.median(p[("native", call)]), statistics.median(p[("kserve", call)])
    print(f"| {call} | {a:.1f} | {b:.1f} | {b / a:.3f} | {'met' if b / a <= 1.10 else 'MISSED'} |")
PY
    fi
    if want python; then
      echo; echo "### Python client (bench/python_client_bench.py), c=1"
      timeout 90 python3 bench/python_client_bench.py --target=127.0.0.1:$port --device=cuda --seconds=$secs
      timeout 60 python3 bench/python_client_bench.py --target=127.0.0.1:$port --device=numpy --seconds=$secs --cases=topk5,argmax1
    fi
    unserve
  fi
  stamp "tp=1"
fi

if want serve; then
  echo; echo "## tp=4 --comm=gloo --backend=cuda, four ranks on the one GPU"
  if serve "$srv" "$tmp/tp4.log" --tp=4 --backend=cuda --comm=gloo --synthetic=1; then
    point_header
    point "c=1 M=5 TOP_K k=8 unary" --rows=5 --mode=topk --k=8 --duration=${secs}s
    point "c=1 M=1 ARGMAX unary" --rows=1 --mode=argmax --duration=${secs}s
    point "c=64 M=5 TOP_K k=8 unary" --rows=5 --mode=topk --k=8 --concurrency=64 --connections=4 --duration=${secs}s
    unserve
  fi
  stamp "tp=4"
fi

# Last, so a test run that outlasts its budget cannot cost the serving table.
if want tests; then
  echo; echo "## GPU tests, --gtest_repeat=50"
  echo "| test binary | result | seconds |"
  echo "| --- | --- | --- |"
  # The two binaries at once: their float64 references are single-threaded CPU work, so one after
  # the other does not fit one device call; at once they also contend for the GPU, which a race
  # would rather show than hide.
  tests=(cuda_backend_test cuda_kernels_test)
  t0=$SECONDS
  for t in "${tests[@]}"; do
    (timeout ${TEST_TIMEOUT:-180} "$DH/bin/tests/$t" --gtest_repeat=50 --gtest_brief=1 >"$tmp/$t.log" 2>&1
     echo $? >"$tmp/$t.rc"; echo $((SECONDS - t0)) >"$tmp/$t.secs") &
  done
  wait
  for t in "${tests[@]}"; do
    rc=$(cat "$tmp/$t.rc")
    fails=$(grep -c '^\[  FAILED  \]' "$tmp/$t.log")
    res="pass (50 repeats)"
    [ "$rc" -eq 124 ] && res="TIMEOUT ($(grep -c 'Repeating all tests' "$tmp/$t.log") repeats started)"
    [ "$rc" -ne 0 ] && [ "$rc" -ne 124 ] && res="FAIL rc=$rc, $fails failures"
    echo "| $t | $res | $(cat "$tmp/$t.secs") |"
    [ "$rc" -ne 0 ] && grep -E '^\[  FAILED  \]|Failure|error' "$tmp/$t.log" | sort | uniq -c | head -20
    cp "$tmp/$t.log" "${OUT:-$tmp}/" 2>/dev/null || true
  done
  stamp tests
fi
