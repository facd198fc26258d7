#!/bin/bash
# Native API vs KServe v2 on one server, side by side (issue 14's figures): M=5 TOP_K k=8 requests
# from the bundled load client (closed loop, concurrency 1, then 8), unary (ComputeLogits /
# ModelInfer) and streamed (StreamLogits / ModelStreamInfer), the two protocols interleaved round
# by round (native, kserve, native, ...) so that drift on a shared machine hits both alike. Two
# servers in turn: the real shapes (tp=4, K=5120, 129280 rows: compute-bound on a CPU) and a small
# head (tp=1, K=5120, 4096 rows), where the per-request cost of the API itself shows.
# Prints one table: per cell the median over ROUNDS of each run's p50, and the ratio kserve/native.
# Usage: bench/kserve_bench.sh [BUILD_DIR] [ROUNDS] [REQUESTS_SMALL] [REQUESTS_REAL]
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}; rounds=${2:-5}; n_small=${3:-400}; n_real=${4:-40}
srv=$build/server/drafthead-server; cli=$build/client/drafthead-client
port=$((20000 + RANDOM % 20000))
out=$(mktemp -d /tmp/kserve_bench.XXXXXX)
start() {  # start [server flags...]
  "$srv" --backend=cpu --comm=gloo --synthetic=1 --listen=127.0.0.1:$port "$@" 2>"$out/server.log" &
  pid=$!
  "$cli" info --target=127.0.0.1:$port --wait=600 >/dev/null
}
stop() { kill -TERM $pid; wait $pid || true; }
run() {  # run NAME REQUESTS CONCURRENCY [load flags...] -> appends one JSON report to $out/NAME.jsonl
  local name=$1 n=$2 c=$3; shift 3
  "$cli" load --target=127.0.0.1:$port --rows=5 --mode=topk --k=8 --concurrency=$c --requests=$n \
    --warmup=1s --quiet --json="$out/run.json" "$@"
  python3 -c "import json,sys; print(json.dumps(json.load(open(sys.argv[1]))['runs'][0]))" "$out/run.json" >>"$out/$name.jsonl"
}
measure() {  # measure SHAPE REQUESTS
  local shape=$1 n=$2
  for ((r = 0; r < rounds; ++r)); do
    for c in 1 8; do
      for call in unary stream; do
        local s=""; [ $call = stream ] && s="--stream"
        run "$shape.$call.c$c.native" $n $c $s
        run "$shape.$call.c$c.kserve" $n $c $s --protocol=kserve
      done
    done
  done
}
echo "date: $(date -u '+%F %H:%M') UTC, host: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)"
echo "load average at start: $(cut -d' ' -f1-3 /proc/loadavg)"
start --tp=1 --hidden-size=5120 --padded-vocab=4096
measure small "$n_small"
stop
start --tp=4
measure real "$n_real"
stop
echo "load average at end: $(cut -d' ' -f1-3 /proc/loadavg)"
python3 - "$out" "$rounds" <<'PY'
import glob, json, os, statistics, sys
out, rounds = sys.argv[1], sys.argv[2]
runs = {}
for f in glob.glob(os.path.join(out, "*.jsonl")):
    runs[os.path.basename(f)[:-6]] = [json.loads(l) for l in open(f)]
def med(name, key):
    rs = runs[name]
    assert all(r["errors"] == 0 for r in rs), f"{name}: errors"
    return statistics.median(key(r) for r in rs)
lat = lambda r: r["latency_us"]["p50"] / 1000
ovh = lambda r: r["server_us"]["network_client"]["p50"]
print(f"\nmedian over {rounds} rounds of each run's p50; overhead = latency - queue - compute (network, "
      "client, server framing and translation)")
print("| head | call | concurrency | native p50 ms | KServe p50 ms | KServe / native | native overhead us | KServe overhead us |")
print("| --- | --- | --- | --- | --- | --- | --- | --- |")
for shape in ("small", "real"):
    for call in ("unary", "stream"):
        for c in ("c1", "c8"):
            a, b = f"{shape}.{call}.{c}.native", f"{shape}.{call}.{c}.kserve"
            if a not in runs:
                continue
            la, lb = med(a, lat), med(b, lat)
            print(f"| {shape} | {call} | {c[1:]} | {la:.2f} | {lb:.2f} | {lb / la:.3f} | {med(a, ovh):.0f} | {med(b, ovh):.0f} |")
PY
rm -rf "$out"
