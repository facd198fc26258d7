#!/bin/bash
# Everything the GPU tables in docs/ are made with, in one device command (< 10 minutes on one
# H200). Here: `bench/gpu/bundle.sh` (builds the CUDA tree, packs it into bundle-gpu/). On the GPU
# machine, from the repository root (the device tool's `carry: ["bundle-gpu"]`):
#
#   bash bench/gpu/serving.sh [all | tests | bench | serve | python]...   (default: all)
#
# bench:  drafthead-bench-cuda --quick at N = 129280 (full vocabulary) and 32320 (one tp=4 shard)
# serve:  issue 22's end-to-end table: the gRPC floor (drafthead-fake-server, the real request,
#         a 256-row head), then tp=1 --comm=nccl, full vocabulary, synthetic weights, listening on
#         TCP loopback and then on a Unix socket: c=1 M=5 TOP_K k=8 unary and stream, M=1 ARGMAX,
#         M=5 FULL_LOGITS bf16; c=64 M=5 TOP_K; every target met / MISSED with the floor beside it;
#         then tp=4 --comm=gloo on the one GPU (c=1 and c=64). The GEMV time of each point is the
#         server's own (Timing.gemv_us, device events around the kernel in the same run), and the
#         M=64 GEMV for the c=64 bound comes from `bench`.
# kserve: issue 14's table: native vs KServe v2 (--protocol=kserve) on the tp=1 server, M=5 TOP_K
#         k=8, unary and stream, c=1, alternating runs (ROUNDS, default 3); ratio of median p50s.
# python: bench/python_client_bench.py against the tp=1 server, torch CUDA tensors and numpy (with
#         serve: over the Unix socket too, and issue 22's Python target checked).
# tests:  every GPU test binary (label cuda) with --gtest_repeat=50, each split into TEST_SHARDS
#         (default 3) gtest shards, all at once, each bounded by TEST_TIMEOUT (last: a slow test
#         run cannot cost the tables above); logs to $OUT if set.
# Prints Markdown tables; SECS (default 4) sets the measured seconds per point, TEST_TIMEOUT (default
# 180) the seconds per test shard (50 repeats; rerun `tests` alone with more if one times out).
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
echo "# commit: ${DH_COMMIT:-unknown} (the bundle's)"

gemv64=""
if want bench; then
  echo; echo "## drafthead-bench-cuda --quick (M = 1, 5, 64)"
  timeout 90 "$DH/bin/bench/drafthead-bench-cuda" --quick --ms=1,5,64 --ns=129280,32320 | tee "$tmp/bench.txt"
  # The fp8 column of the M = 64 row under the full-vocabulary header.
  gemv64=$(awk '/^## N=129280 /{on=1} on && /^\| 64 \|/{print $4; exit}' "$tmp/bench.txt")
  stamp bench
fi

# Issue 22's c=1 bounds over the GEMV of the same point (us): unary / stream / ARGMAX / FULL bf16.
# The unary points also with the client library's blocking call (--client-api=blocking: no hand-off
# of the answer to a gRPC callback thread on the client side), bound as their callback twins.
declare -A bounds=([topk_unary]=150 [topk_stream]=100 [argmax]=130 [full]=350 [topk_blocking]=150 [argmax_blocking]=130)
c1_points=("topk_unary|c=1 M=5 TOP_K k=8 unary|--rows=5 --mode=topk --k=8"
           "topk_blocking|c=1 M=5 TOP_K k=8 unary, blocking client|--rows=5 --mode=topk --k=8 --client-api=blocking"
           "topk_stream|c=1 M=5 TOP_K k=8 stream|--rows=5 --mode=topk --k=8 --stream"
           "argmax|c=1 M=1 ARGMAX unary|--rows=1 --mode=argmax"
           "argmax_blocking|c=1 M=1 ARGMAX unary, blocking client|--rows=1 --mode=argmax --client-api=blocking"
           "full|c=1 M=5 FULL_LOGITS bf16 unary|--rows=5 --mode=full --dtype=bf16")
# c1_run PREFIX: the c=1 points against $POINT_TARGET / $port, each saved as $tmp/PREFIX.NAME.json.
c1_run() {
  local spec name rest
  for spec in "${c1_points[@]}"; do
    name=${spec%%|*}; rest=${spec#*|}
    # shellcheck disable=SC2086
    point "$1: ${rest%%|*}" ${rest#*|} --duration=${secs}s 2>/dev/null
    [ -f "$tmp/point.json" ] && cp "$tmp/point.json" "$tmp/$1.$name.json"
  done
}

if want serve || want python || want kserve; then
  if want serve; then
    # The gRPC floor of this host in the same run: the fake server (answers at once) with the real
    # request (K = 5120) and a 256-row toy head, over TCP loopback and a Unix socket.
    # Both gRPC server APIs: callback (drafthead's) and sync (the polling thread runs the handler;
    # the fake serves no streams there, so that row reads failed).
    echo; echo "## The gRPC floor: drafthead-fake-server, K = 5120, 256-row head"
    point_header
    for api in callback sync; do
      for way in tcp unix; do
        sock=""; [ $way = unix ] && sock=$tmp/fake.sock
        if SERVE_UNIX=$sock serve "$DH/bin/client/drafthead-fake-server" "$tmp/fake-$way.log" --hidden-size=5120 \
             --vocab-size=256 --api=$api; then
          pre=fake_$way; [ $api = sync ] && pre=fakesync_$way
          POINT_TARGET=${sock:+unix:$sock} c1_run $pre
          unserve
        fi
      done
    done
    stamp floor
  fi
  echo; echo "## tp=1 --comm=nccl, full vocabulary, synthetic weights"
  for way in tcp unix; do
    [ $way = unix ] && ! want serve && break  # python / kserve need the TCP server only
    sock=""; [ $way = unix ] && sock=$tmp/drafthead.sock
    echo; echo "### listening on $way"
    SERVE_UNIX=$sock serve "$srv" "$tmp/tp1-$way.log" --tp=1 --backend=cuda --comm=nccl --synthetic=1 || continue
    export POINT_TARGET=${sock:+unix:$sock}
    target=${POINT_TARGET:-127.0.0.1:$port}
    if want serve; then
      point_header
      c1_run $way
      point "$way: c=64 M=5 TOP_K k=8 unary" --rows=5 --mode=topk --k=8 --concurrency=64 --connections=4 --duration=${secs}s
      cp "$tmp/point.json" "$tmp/$way.c64.json"
    fi
    if want python; then
      echo; echo "### Python client (bench/python_client_bench.py) over $way, c=1"
      timeout 90 python3 bench/python_client_bench.py --target=$target --device=cuda --seconds=$secs | tee "$tmp/$way.python.txt"
      [ $way = tcp ] && timeout 60 python3 bench/python_client_bench.py --target=$target --device=numpy --seconds=$secs --cases=topk5,argmax1
    fi
    if want kserve && [ $way = tcp ]; then
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
    unset POINT_TARGET
    unserve
    stamp "tp=1 $way"
  done
  if want serve; then
    # Issue 22's targets, per transport: GEMV = the server's gemv_us p50 of the same point; the
    # floor = the fake server's p50 on the same point and transport in this run.
    echo; echo "### Issue 22 targets (c=1: GEMV + bound; compute <= GEMV + 20; queue <= 10)"
    python3 - "$tmp" "${gemv64:-}" "$(IFS=,; for k in "${!bounds[@]}"; do echo -n "$k=${bounds[$k]},"; done)" <<'PY'
import json, os, re, sys
tmp, gemv64, bounds = sys.argv[1], sys.argv[2], dict(kv.split('=') for kv in sys.argv[3].strip(',').split(','))
ok = lambda c: 'met' if c else 'MISSED'
def run(path):
    return json.load(open(path))['runs'][0] if os.path.exists(path) else None
print("| transport | point | GEMV | floor p50 (callback / sync server) | p50 | bound | p50 - floor | p99 | compute p50 | queue p50 |")
print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
for way in ('tcp', 'unix'):
    for name in ('topk_unary', 'topk_blocking', 'topk_stream', 'argmax', 'argmax_blocking', 'full'):
        r, f = run(f"{tmp}/{way}.{name}.json"), run(f"{tmp}/fake_{way}.{name}.json")
        if r is None:
            continue
        g = r['server_stages_us']['gemv']['p50']
        p50, b = r['latency_us']['p50'], float(bounds[name])
        comp, queue = r['server_us']['compute']['p50'], r['server_us']['queue']['p50']
        fl = f['latency_us']['p50'] if f else None
        fs = run(f"{tmp}/fakesync_{way}.{name}.json")
        fl_s = (f"{fl:.0f}" if fl else '-') + (f" / {fs['latency_us']['p50']:.0f}" if fs and fs['ok'] else '')
        over = f"{p50 - fl:.0f}" if fl else '-'
        c_s = f"{comp:.0f} ({ok(comp <= g + 20)})" if name != 'full' else f"{comp:.0f}"
        print(f"| {way} | {name} | {g:.0f} | {fl_s} | {p50:.0f} | GEMV + {b:.0f}: {ok(p50 <= g + b)} | {over} | "
              f"{r['latency_us']['p99']:.0f} | {c_s} | {queue:.0f} ({ok(queue <= 10)}) |")
g64 = float(gemv64) if gemv64 else None
for way in ('tcp', 'unix'):
    r = run(f"{tmp}/{way}.c64.json")
    if r is None:
        continue
    bound = 0.85 * 64 / (g64 * 1e-6) if g64 else None
    verdict = (ok(r['rows_per_s'] >= bound and r['errors'] == 0)) if bound else 'no M=64 GEMV (run bench)'
    print(f"\nc=64 over {way}: {r['rows_per_s']:.0f} rows/s, {r['errors']} errors, batch_rows p50 {r['batch_rows_p50']}; "
          f"85% of 64 / GEMV(M=64 = {g64} us) = {bound and round(bound)} rows/s: {verdict}")
# Python over gRPC, torch CUDA tensors, M=5 TOP_K: p50 <= the C++ load tester's unary p50 + 150.
for way in ('tcp', 'unix'):
    path, r = f"{tmp}/{way}.python.txt", run(f"{tmp}/{way}.topk_unary.json")
    if not os.path.exists(path) or r is None:
        continue
    for line in open(path):
        m = re.match(r"\| M=5 TOP_K k=8 \| off \| \d+ \| ([0-9.]+) \|", line)
        if m:
            py, cpp = float(m.group(1)), r['latency_us']['p50']
            print(f"Python over {way}, torch CUDA, M=5 TOP_K: p50 {py:.0f} us vs C++ {cpp:.0f} + 150 = {cpp + 150:.0f}: {ok(py <= cpp + 150)}")
PY
  fi
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
  shards=${TEST_SHARDS:-3}
  echo; echo "## GPU tests, --gtest_repeat=50, each binary in $shards gtest shards"
  echo "| test binary | result | seconds |"
  echo "| --- | --- | --- |"
  # Every shard of both binaries at once: their float64 references are single-threaded CPU work,
  # so one after the other does not fit one device call (cuda_backend_test alone ran past 500 s);
  # at once they also contend for the GPU, which a race would rather show than hide.
  tests=(cuda_backend_test cuda_kernels_test)
  t0=$SECONDS
  for t in "${tests[@]}"; do
    for ((i = 0; i < shards; ++i)); do
      (GTEST_TOTAL_SHARDS=$shards GTEST_SHARD_INDEX=$i timeout ${TEST_TIMEOUT:-180} "$DH/bin/tests/$t" \
         --gtest_repeat=50 --gtest_brief=1 >"$tmp/$t.$i.log" 2>&1
       echo $? >"$tmp/$t.$i.rc"; echo $((SECONDS - t0)) >"$tmp/$t.$i.secs") &
    done
  done
  wait
  for t in "${tests[@]}"; do
    for ((i = 0; i < shards; ++i)); do
      log=$tmp/$t.$i.log rc=$(cat "$tmp/$t.$i.rc")
      fails=$(grep -c '^\[  FAILED  \]' "$log")
      # --gtest_brief prints one "[==========] N tests from M test suites ran." line per finished repeat.
      done_n=$(grep -c '^\[==========\] .* ran\.' "$log")
      res="pass ($done_n repeats of $(grep -m1 -oE '^\[==========\] [0-9]+ tests' "$log" | grep -oE '[0-9]+') tests)"
      [ "$rc" -eq 124 ] && res="TIMEOUT after $done_n finished repeats, $fails failures"
      [ "$rc" -ne 0 ] && [ "$rc" -ne 124 ] && res="FAIL rc=$rc, $fails failures"
      echo "| $t shard $i of $shards | $res | $(cat "$tmp/$t.$i.secs") |"
      [ "$rc" -ne 0 ] && grep -E '^\[  FAILED  \]|Failure|error' "$log" | sort | uniq -c | head -20
      cp "$log" "${OUT:-$tmp}/" 2>/dev/null || true
    done
  done
  stamp tests
fi
