#!/bin/bash
# Serving benchmark (issue #4's figures) on this machine: a tp=4 CPU group at the real shapes
# (synthetic weights), M=5 TOP_K k=8 requests from the bundled load client at concurrency 1, 8,
# 64, with batching on (default) and off (--max-batch-requests=1); then a soak at concurrency 32
# with rank 0's RSS before and after. Prints tables. Usage: bench/serving_bench.sh [BUILD_DIR]
# [SECONDS_PER_POINT] [SOAK_SECONDS]
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}; secs=${2:-10}; soak=${3:-60}
srv=$build/server/drafthead-server; cli=$build/client/drafthead-client
port=$((20000 + RANDOM % 20000))
start() {  # start [extra server flags...]
  "$srv" --tp=4 --backend=cpu --comm=gloo --synthetic=1 --listen=127.0.0.1:$port "$@" 2>/tmp/serving_bench.log &
  pid=$!
  "$cli" info --target=127.0.0.1:$port --wait=600 >/dev/null
}
stop() { kill -TERM $pid; wait $pid || true; }
point() {  # point CONCURRENCY -> "rows/s p50_ms p99_ms batch_rows_p50"
  "$cli" load --target=127.0.0.1:$port --rows=5 --mode=topk --k=8 --concurrency=$1 \
    --duration=${secs}s --warmup=2s --json=/tmp/serving_bench.json >/dev/null
  python3 - <<'PY'
import json
r = json.load(open('/tmp/serving_bench.json'))['runs'][0]
lat = r['latency_us']
print(f"{r['rows_per_s']:.1f} {lat['p50']/1000:.1f} {lat['p99']/1000:.1f} {r['batch_rows_p50']} {r['errors']}")
PY
}
echo "date: $(date -u +%F), host: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)"
echo "| batching | concurrency | rows/s | p50 ms | p99 ms | median batch_rows | errors |"
echo "| --- | --- | --- | --- | --- | --- | --- |"
for mode in on off; do
  if [ $mode = on ]; then start; else start --max-batch-requests=1; fi
  for c in 1 8 64; do
    read -r rps p50 p99 br err <<<"$(point $c)"
    echo "| $mode | $c | $rps | $p50 | $p99 | $br | $err |"
  done
  stop
done
start
rss() { awk '/VmRSS/{print $2}' /proc/$pid/status; }
"$cli" load --target=127.0.0.1:$port --rows=5 --mode=topk --k=8 --concurrency=32 --duration=5s >/dev/null
before=$(rss)
"$cli" load --target=127.0.0.1:$port --rows=5 --mode=topk --k=8 --concurrency=32 \
  --duration=${soak}s --json=/tmp/serving_soak.json >/dev/null
after=$(rss)
errors=$(python3 -c "import json;r=json.load(open('/tmp/serving_soak.json'))['runs'][0];print(r['errors'], r['answered'])")
echo
echo "| soak | seconds | rank-0 RSS before (KiB) | after (KiB) | growth | errors / requests |"
echo "| --- | --- | --- | --- | --- | --- |"
python3 -c "b=$before;a=$after;print(f'| c=32 | $soak | {b} | {a} | {100*(a-b)/b:+.2f}% | ${errors% *} / ${errors#* } |')"
stop
