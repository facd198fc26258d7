#!/bin/bash
# Issue 21's GPU tables (the same-host lane) in one device command. Here: `bench/gpu/bundle.sh`
# (it also copies the seed into bundle-gpu/seed/). On the GPU machine, from the repository root
# (the device tool's `carry: ["bundle-gpu"]`):
#
#   bash bench/gpu/lane.sh [check] [cpp] [python] [mps] [tp4]...   (default: all of them)
#
# check:  tests/lane_cuda_test.py (torch CUDA tensors over the lane == gRPC, every mode, REPEAT=50)
# cpp:    drafthead-client load, gRPC (--lane=off) vs the lane (--lane=shm), alternating rounds:
#         c=1 M=5 TOP_K k=8, M=1 ARGMAX, M=5 FULL_LOGITS bf16; c=64 M=5 TOP_K over one lane of depth
#         64; GEMV = the server's own Timing.gemv_us p50 of the same point.
# python: bench/gpu/lane_python_bench.py: torch CUDA in/out, gRPC vs lane vs the in-process original
#         (the seed's Triton kernel + torch.topk), M = 1, 5, 16, 64; host time per stream-ordered call.
#         PROFILE=N: then N stream-ordered calls under cProfile (where a call's host time goes).
# transport: the Python client's gRPC call through grpcio against the native library
#         (lane_python_bench.py --transports: TOP_K, ARGMAX, FULL_LOGITS bf16), beside the C++ load
#         tester's p50 of M=5 TOP_K.
# hostio: the Python lane's two ways for torch CUDA tensors, its CUDA arenas against host IO (rows
#         into the host arena, token answers inline), alternating rounds (lane_python_bench.py --host-io).
# hostcopies: Python over gRPC with torch CUDA tensors, the client's pinned copies against pageable
#         ones (lane_python_bench.py --host-copies), alternating rounds.
# pieces: the host time of each piece of a stream-ordered Python call (torch ops, libcuda calls)
#         beside the whole call (lane_python_bench.py --pieces; PIECES=N calls a piece, 6400).
# mps:    cpp, python and pieces again with the CUDA MPS daemon running (server and caller share the GPU).
# tp4:    tp=4 --comm=gloo on the one GPU, c=1 M=5 TOP_K, gRPC vs lane.
# breakdown: the Python lane, M=5 TOP_K: numpy rows against torch CUDA ones, beside the C++ client's
#         p50 (lane_python_bench.py --breakdown): where a GPU caller's time goes.
# versus: OLD=PATH (another build's drafthead-server, e.g. carried in bundle-gpu/old/): the Python
#         lane against this bundle's server and that one side by side (lane_python_bench.py --versus),
#         ABBA rounds: M=5 TOP_K k=8, M=1 ARGMAX, M=5 FULL bf16 into the lane's CUDA arena.
# spin:   the caller's spin budget over the lane, fixed 200 us vs automatic (--lane-spin-us=200 / -1,
#         alternating on one server): c=1 M=5 TOP_K k=8 and M=1 ARGMAX (issue 21, session 12's change).
# spin64: c=64 M=5 TOP_K over one lane of depth 64, spin budget automatic / 20 us / 0 (64 caller
#         threads spinning on 16 cores may take the server's; issue 22's c=64 target).
# batches: c=64 M=5 TOP_K k=8, gRPC and the lane, from the server's /metrics over each run
#         (bench/gpu/metrics_delta.py): rows a batch, the GPU stages' share of the wall time,
#         the share launched ahead; whether the c=64 batches run back to back (issue 22: 83 % of 85 %).
# Server: tp=1 --comm=nccl, full vocabulary (129280 x 5120), synthetic weights. SECS per point (2).
set -uo pipefail
cd "$(dirname "$0")/../.."
source bench/gpu/env.sh
srv=$DH/bin/server/drafthead-server
cli=$DH/bin/client/drafthead-client
secs=${SECS:-2}
rounds=${ROUNDS:-2}
tmp=$(mktemp -d)
source bench/serving_lib.sh
phases=("$@")
[ ${#phases[@]} -eq 0 ] && phases=(check cpp spin python mps tp4)
want() { [[ " ${phases[*]} " == *" $1 "* ]]; }
t_start=$SECONDS
stamp() { echo "[$1 done at +$((SECONDS - t_start)) s]"; }
export DRAFTHEAD_LANE_LIB=$DH/lib/libdrafthead_lane.so
mps_dir=$tmp/mps
cleanup() {
  unserve 2>/dev/null
  if [ -n "${mps_on:-}" ]; then echo quit | CUDA_MPS_PIPE_DIRECTORY=$mps_dir /usr/local/nvidia/bin/nvidia-cuda-mps-control; fi
  rm -rf "$tmp"
}
trap cleanup EXIT

echo "# date: $(date -u '+%F %H:%M UTC'), $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1)"
echo "# commit: ${DH_COMMIT:-unknown} (the bundle's)"

# A C++ point as a table row: way, p50, p99, GEMV p50, p50 - GEMV, the epilogue stage's p50, the
# server's compute p50 and what lies outside it (the way in and out, validation, the client), rows/s,
# calls in flight (the load tester's in_flight_mean: how much of --concurrency it kept), errors.
cpp_point() {  # LABEL WAY FLAGS...
  local label=$1 way=$2
  shift 2
  "$cli" load --target=127.0.0.1:$port --warmup=1s --duration=${secs}s --json="$tmp/p.json" --quiet "$@" >/dev/null 2>"$tmp/err" \
    || { echo "| $label | $way | failed: $(tail -1 "$tmp/err") |"; return; }
  python3 - "$tmp/p.json" "$label" "$way" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))['runs'][0]
lat, st = r['latency_us'], r.get('server_stages_us', {})
g = st.get('gemv', {}).get('p50', float('nan'))
e = st.get('epilogue', {}).get('p50', float('nan'))
c = r.get('server_us', {}).get('compute', {}).get('p50', float('nan'))
v = st.get('validate', {}).get('p50', float('nan'))
q = r.get('server_us', {}).get('queue', {}).get('p50', float('nan'))
h, d = (st.get(n, {}).get('p50', float('nan')) for n in ('h2d', 'd2h'))
print(f"| {sys.argv[2]} | {sys.argv[3]} | {lat['p50']:.0f} | {lat['p99']:.0f} | {g:.0f} | {lat['p50'] - g:.0f} | "
      f"{e:.0f} | {c:.0f} | {lat['p50'] - c:.0f} | {v:.0f} / {q:.0f} / {h:.0f} / {d:.0f} | "
      f"{r['rows_per_s']:.0f} | {r.get('in_flight_mean', float('nan')):.1f} | {r['errors']} |")
PY
}
cpp_header() {  # FIRST_COLUMN_AFTER_POINT
  echo "| point | $1 | p50 us | p99 us | GEMV p50 us | p50 - GEMV | epilogue p50 | server compute p50 | p50 - compute | validate / queue / h2d / d2h p50 | rows/s | in flight | errors |"
  echo "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"
}

cpp_table() {  # TITLE
  echo; echo "### C++ client (drafthead-client load), $1"
  cpp_header "way"
  for r in $(seq "$rounds"); do
    for way in off shm; do
      cpp_point "c=1 M=5 TOP_K k=8" $way --lane=$way --rows=5 --mode=topk --k=8
      cpp_point "c=1 M=1 ARGMAX" $way --lane=$way --rows=1 --mode=argmax
      cpp_point "c=1 M=5 FULL_LOGITS bf16" $way --lane=$way --rows=5 --mode=full --dtype=bf16
    done
  done
  cpp_point "c=64 M=5 TOP_K k=8" off --lane=off --rows=5 --mode=topk --k=8 --concurrency=64 --connections=4
  cpp_point "c=64 M=5 TOP_K k=8" shm --lane=shm --rows=5 --mode=topk --k=8 --concurrency=64
}

spin64_table() {  # TITLE: c=64 over one lane of depth 64, the callers' spin budget (64 threads on 16 cores)
  echo; echo "### C++ client over the lane, c=64, the callers' spin budget, $1"
  cpp_header "spin budget"
  for r in $(seq "$rounds"); do
    for spin in -1 20 0; do
      cpp_point "c=64 M=5 TOP_K k=8" "$spin" --lane=shm --lane-spin-us=$spin --rows=5 --mode=topk --k=8 --concurrency=64
    done
  done
}

cpp_p50() {  # WAY LABEL: the C++ load tester's p50 of c=1 M=5 TOP_K k=8 (--lane=WAY), as one line
  "$cli" load --target=127.0.0.1:$port --warmup=1s --duration=${secs}s --json="$tmp/c.json" --quiet --lane=$1 \
    --rows=5 --mode=topk --k=8 >/dev/null 2>&1 && python3 -c "import json,sys; print('C++ load tester, $2 M=5 TOP_K k=8 p50 us:', round(json.load(open(sys.argv[1]))['runs'][0]['latency_us']['p50']))" "$tmp/c.json"
}

server_tp1() {  # [PROGRAM LOG]: this bundle's server by default; its /metrics on 127.0.0.1:$mport
  mport=$(port_pick)
  serve "${1:-$srv}" "${2:-$tmp/tp1.log}" --tp=1 --backend=cuda --comm=nccl --synthetic=1 \
    --shared-memory=system,cuda --lanes=8 --max-rows=64 --metrics-listen=127.0.0.1:$mport
}

batches_table() {  # TITLE: c=64 runs between two /metrics scrapes each (metrics_delta.py)
  echo; echo "### c=64 M=5 TOP_K k=8 batches from the server's /metrics, $1"
  python3 bench/gpu/metrics_delta.py header
  load64() {  # WAY SECONDS
    local extra=()
    [ "$1" = off ] && extra=(--connections=4)
    "$cli" load --target=127.0.0.1:$port --lane=$1 --rows=5 --mode=topk --k=8 --concurrency=64 "${extra[@]}" \
      --warmup=0s --duration=${2}s --quiet >/dev/null 2>&1
  }
  for r in $(seq "$rounds"); do
    for way in off shm; do
      load64 $way 1  # warm: the window below starts loaded
      python3 bench/gpu/metrics_delta.py snap 127.0.0.1:$mport "$tmp/m0.json" || return
      load64 $way "$secs" || echo "| $way | the load run failed |"
      python3 bench/gpu/metrics_delta.py snap 127.0.0.1:$mport "$tmp/m1.json" || return
      python3 bench/gpu/metrics_delta.py delta "$tmp/m0.json" "$tmp/m1.json" "$way"
    done
  done
}

spin_table() {  # TITLE
  echo; echo "### C++ client over the lane, the caller's spin budget, $1"
  cpp_header "spin budget"
  for r in $(seq "$rounds"); do
    for spin in 200 -1; do
      cpp_point "c=1 M=5 TOP_K k=8" "$spin" --lane=shm --lane-spin-us=$spin --rows=5 --mode=topk --k=8
      cpp_point "c=1 M=1 ARGMAX" "$spin" --lane=shm --lane-spin-us=$spin --rows=1 --mode=argmax
    done
  done
}

run_set() {  # TITLE
  if server_tp1; then
    if want cpp; then cpp_table "tp=1 nccl, full vocabulary, $1"; stamp "cpp $1"; fi
    if want spin; then spin_table "tp=1 nccl, full vocabulary, $1"; stamp "spin $1"; fi
    if want spin64; then spin64_table "tp=1 nccl, full vocabulary, $1"; stamp "spin64 $1"; fi
    if want batches; then batches_table "tp=1 nccl, full vocabulary, $1"; stamp "batches $1"; fi
    if want python; then
      echo
      timeout 240 python3 bench/gpu/lane_python_bench.py --target=127.0.0.1:$port --rounds="$rounds" --seconds=1 \
        --seed-file=bundle-gpu/seed/draft_head_fp8.py.txt --label="tp=1 nccl, $1" --profile=${PROFILE:-0} 2>&1 \
        | tail -$([ "${PROFILE:-0}" -gt 0 ] && echo 90 || echo 12)
      stamp "python $1"
    fi
    if want breakdown; then
      echo
      cpp_p50 shm lane
      timeout 200 python3 bench/gpu/lane_python_bench.py --target=127.0.0.1:$port --breakdown --rounds="$rounds" \
        --seconds=1 2>&1 | tail -9
      stamp "breakdown $1"
    fi
    if want versus; then
      echo
      local this_port=$port this_pid=$pid
      if server_tp1 "$OLD" "$tmp/old.log"; then
        echo "# other: $OLD ($(stat -c %y "$OLD" | cut -c1-16)), this: the bundle's"
        timeout 300 python3 bench/gpu/lane_python_bench.py --target=127.0.0.1:$this_port --versus=127.0.0.1:$port \
          --rounds="$rounds" --seconds=1 2>&1 | tail -6
        unserve
      fi
      port=$this_port pid=$this_pid
      stamp "versus $1"
    fi
    if want transport; then
      echo
      cpp_p50 off gRPC
      timeout 200 python3 bench/gpu/lane_python_bench.py --target=127.0.0.1:$port --transports --rounds="$rounds" \
        --seconds=1 2>&1 | tail -7
      stamp "transport $1"
    fi
    if want hostio; then
      echo
      timeout 300 python3 bench/gpu/lane_python_bench.py --target=127.0.0.1:$port --host-io --rounds="$rounds" \
        --seconds=1 2>&1 | tail -10
      stamp "hostio $1"
    fi
    if want hostcopies; then
      echo
      timeout 200 python3 bench/gpu/lane_python_bench.py --target=127.0.0.1:$port --host-copies --rounds="$rounds" \
        --seconds=1 2>&1 | tail -6
      stamp "hostcopies $1"
    fi
    if want pieces; then
      echo
      timeout 120 python3 bench/gpu/lane_python_bench.py --target=127.0.0.1:$port --pieces=${PIECES:-6400} 2>&1 | tail -20
      stamp "pieces $1"
    fi
    unserve
  fi
}

if want check; then
  # Its own small server (K=512, 8000 of 8192 rows, tp=1 nccl) so that 50 rounds take seconds.
  echo; echo "## tests/lane_cuda_test.py (REPEAT=${REPEAT:-50})"
  PYTHONUNBUFFERED=1 timeout 200 python3 tests/lane_cuda_test.py >"${OUT:-$tmp}/lane_cuda_test.log" 2>&1
  echo "exit $?"; grep -E "^(test_|Ran |OK|FAILED)|Error|error" "${OUT:-$tmp}/lane_cuda_test.log" | head -30
  stamp check
fi

run_set "no MPS"

if want mps; then
  mkdir -p "$mps_dir"
  export CUDA_MPS_PIPE_DIRECTORY=$mps_dir CUDA_MPS_LOG_DIRECTORY=$mps_dir
  if /usr/local/nvidia/bin/nvidia-cuda-mps-control -d; then
    mps_on=1
    run_set "MPS"
    echo quit | /usr/local/nvidia/bin/nvidia-cuda-mps-control
    mps_on=
  else
    echo "MPS daemon did not start"
  fi
  unset CUDA_MPS_PIPE_DIRECTORY CUDA_MPS_LOG_DIRECTORY
fi

if want tp4; then
  if serve "$srv" "$tmp/tp4.log" --tp=4 --backend=cuda --comm=gloo --synthetic=1 --shared-memory=system \
      --lanes=8; then
    echo; echo "### C++ client, tp=4 --comm=gloo on the one GPU"
    cpp_header way
    for r in $(seq "$rounds"); do
      for way in off shm; do cpp_point "c=1 M=5 TOP_K k=8" $way --lane=$way --rows=5 --mode=topk --k=8; done
    done
    unserve
  fi
  stamp tp4
fi
