#!/bin/bash
# Native API vs KServe v2 on one server, side by side (issue 14's figures): M=5 TOP_K k=8 requests
# from the bundled load client, unary (ComputeLogits / ModelInfer) and streamed (StreamLogits /
# ModelStreamInfer), closed loop at concurrency C per protocol. Each round runs the two protocols
# AT THE SAME TIME (two client processes, same duration) against one server, so that whatever else
# the machine does hits both alike; their requests share the queue and batches. Two servers in
# turn: a small head (tp=1, K=5120, 4096 rows: the per-request cost of the API shows) and the real
# shapes (tp=4, K=5120, 129280 rows: compute-bound on a CPU).
# Prints one table: per cell the median over ROUNDS of each run's p50, and the ratio kserve/native.
# Usage: bench/kserve_bench.sh [BUILD_DIR] [ROUNDS] [SECONDS_SMALL] [SECONDS_REAL] [CONCURRENCY]
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}; rounds=${2:-5}; secs_small=${3:-4}; secs_real=${4:-8}; conc=${5:-1}
srv=$build/server/drafthead-server; cli=$build/client/drafthead-client
port=$((20000 + RANDOM % 20000))
out=$(mktemp -d /tmp/kserve_bench.XXXXXX)
start() {  # start [server flags...]
  "$srv" --backend=cpu --comm=gloo --synthetic=1 --listen=127.0.0.1:$port "$@" 2>"$out/server.log" &
  pid=$!
  "$cli" info --target=127.0.0.1:$port --wait=600 >/dev/null
}
stop() { kill -TERM $pid; wait $pid || true; }
load() {  # load PROTOCOL SECONDS JSON [load flags...]
  local protocol=$1 secs=$2 json=$3; shift 3
  "$cli" load --target=127.0.0.1:$port --rows=5 --mode=topk --k=8 --concurrency=$conc --duration=${secs}s \
    --warmup=1s --quiet --protocol=$protocol --json="$json" "$@"
}
measure() {  # measure SHAPE SECONDS: ROUNDS x {unary, stream} x {native and kserve at once}
  local shape=$1 secs=$2
  for ((r = 0; r < rounds; ++r)); do
    for call in unary stream; do
      local s=""; [ $call = stream ] && s="--stream"
      load native $secs "$out/a.json" $s & local a=$!
      load kserve $secs "$out/b.json" $s & local b=$!
      wait $a; wait $b
      for p in native:a kserve:b; do
        python3 -c "import json,sys; print(json.dumps(json.load(open(sys.argv[1]))['runs'][0]))" \
          "$out/${p#*:}.json" >>"$out/$shape.$call.${p%:*}.jsonl"
      done
    done
  done
}
echo "date: $(date -u '+%F %H:%M') UTC, host: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)"
echo "load average at start: $(cut -d' ' -f1-3 /proc/loadavg)"
start --tp=1 --hidden-size=5120 --padded-vocab=4096
measure small "$secs_small"
stop
start --tp=4
measure real "$secs_real"
stop
echo "load average at end: $(cut -d' ' -f1-3 /proc/loadavg)"
python3 - "$out" "$rounds" "$conc" <<'PY'
import glob, json, os, statistics, sys
out, rounds, conc = sys.argv[1:4]
runs = {os.path.basename(f)[:-6]: [json.loads(l) for l in open(f)] for f in glob.glob(os.path.join(out, "*.jsonl"))}
def med(name, key):
    rs = runs[name]
    assert all(r["errors"] == 0 for r in rs), f"{name}: errors"
    return statistics.median(key(r) for r in rs)
lat = lambda r: r["latency_us"]["p50"] / 1000
ovh = lambda r: r["server_us"]["network_client"]["p50"]
n = lambda r: r["ok"]
print(f"\nconcurrency {conc} per protocol, both at once; median over {rounds} rounds of each run's p50; "
      "overhead = latency - queue - compute (network, gRPC, client, translation)")
print("| head | call | native p50 ms | KServe p50 ms | KServe / native | native overhead us | KServe overhead us | requests per run (native / KServe) |")
print("| --- | --- | --- | --- | --- | --- | --- | --- |")
for shape in ("small", "real"):
    for call in ("unary", "stream"):
        a, b = f"{shape}.{call}.native", f"{shape}.{call}.kserve"
        la, lb = med(a, lat), med(b, lat)
        print(f"| {shape} | {call} | {la:.2f} | {lb:.2f} | {lb / la:.3f} | {med(a, ovh):.0f} | {med(b, ovh):.0f} "
              f"| {med(a, n):.0f} / {med(b, n):.0f} |")
PY
rm -rf "$out"
