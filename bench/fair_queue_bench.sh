#!/bin/bash
# Issue 24's throughput target: 64 callers of equal load, fair queueing against FIFO in one run.
#
#   bench/fair_queue_bench.sh [BUILD_DIR] [SECONDS_PER_POINT] [ROUNDS] [CONCURRENCY]
#
# Two CPU servers side by side, the same but for --queue-policy=fair and --queue-policy=fifo
# (tp=1, synthetic weights, K=1024 and 64000 vocab rows: a 60-row batch is tens of ms of GEMV on a
# 2-core machine, so the queue is deep and its order matters). Each is driven in turn (fair, fifo,
# fair, fifo, ... ROUNDS times) by `drafthead-client load -c CONCURRENCY` (default 64) with M=5
# TOP_K k=8 unary calls, one channel per in-flight call: 64 callers of one request each, told apart
# by the server (unary callers are keyed by connection). The idle server waits on its queue.
# Prints a Markdown table: policy, round, req/s, rows/s, p50 / p99 over all callers, the per-caller
# p50s' min and max and their ratio, the largest per-caller p99, the 1-minute load average after the
# point (this machine is shared: other builds show there). The target: per-caller p50 max/min
# <= 1.10 with fair queueing, and fair's rows/s no lower than fifo's.
#
# STREAM=1 drives one StreamLogits stream per caller instead of unary calls.
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}; secs=${2:-15}; rounds=${3:-2}; conc=${4:-64}
srv=$build/server/drafthead-server; cli=$build/client/drafthead-client
tmp=$(mktemp -d)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
  rm -rf "$tmp"
}
trap cleanup EXIT
source bench/serving_lib.sh

server_flags=(--tp=1 --backend=cpu --comm=gloo --synthetic=1 --hidden-size=1024 --padded-vocab=64000)
load_flags=(--rows=5 --mode=topk --k=8 --concurrency="$conc" --duration="${secs}s" --warmup=2s)
[ "${STREAM:-0}" = 1 ] && load_flags+=(--stream)

echo "date: $(date -u '+%F %H:%M UTC'), host: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)"
echo "server: ${server_flags[*]} --queue-policy=fair|fifo"
echo "load:   drafthead-client load ${load_flags[*]} (one channel per caller)"
declare -A ports
for policy in fair fifo; do
  serve "$srv" "$tmp/$policy.log" "${server_flags[@]}" --queue-policy=$policy
  pids+=("$pid")
  ports[$policy]=$port
  grep -q "queue_policy=$policy" "$tmp/$policy.log" || { echo "the $policy server does not say queue_policy=$policy" >&2; exit 1; }
done

echo
echo "| policy | round | req/s | rows/s | p50 ms | p99 ms | callers | per-caller p50 min / max ms | max/min | per-caller p99 max ms | errors | batch rows p50 | load avg |"
echo "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"
for ((round = 1; round <= rounds; round++)); do
  for policy in fair fifo; do
    out=$tmp/$policy-$round.json
    "$cli" load --target=127.0.0.1:${ports[$policy]} "${load_flags[@]}" --json="$out" --quiet >/dev/null
    python3 - "$out" "$policy" "$round" "$(cut -d' ' -f1 /proc/loadavg)" <<'PY' | tee -a "$tmp/rows.txt"
import json, sys
r = json.load(open(sys.argv[1]))['runs'][0]
s, lat = r['callers_summary'], r['latency_us']
print(f"| {sys.argv[2]} | {sys.argv[3]} | {r['requests_per_s']:.1f} | {r['rows_per_s']:.0f} | "
      f"{lat['p50'] / 1000:.1f} | {lat['p99'] / 1000:.1f} | {s['answered']} of {s['callers']} {s['kind']}s | "
      f"{s['p50_us_min'] / 1000:.1f} / {s['p50_us_max'] / 1000:.1f} | {s['p50_max_over_min']:.3f} | "
      f"{s['p99_us_max'] / 1000:.1f} | {r['errors']} | {r['batch_rows_p50']:.0f} | {sys.argv[4]} |")
PY
  done
done

# Per policy: the mean of the rounds' rows/s and the worst per-caller p50 spread.
echo
python3 - "$tmp/rows.txt" <<'PY'
import sys, collections
rows = collections.defaultdict(list)
for line in open(sys.argv[1]):
    c = [x.strip() for x in line.strip().strip('|').split('|')]
    rows[c[0]].append((float(c[3]), float(c[8])))
for p in ('fair', 'fifo'):
    v = rows[p]
    print(f"{p}: rows/s mean {sum(x for x, _ in v) / len(v):.0f} over {len(v)} rounds, "
          f"per-caller p50 max/min worst {max(y for _, y in v):.3f}")
fair = sum(x for x, _ in rows['fair']) / len(rows['fair'])
fifo = sum(x for x, _ in rows['fifo']) / len(rows['fifo'])
print(f"fair / fifo rows/s: {fair / fifo:.3f}")
PY
