#!/bin/bash
# The main job: a four-rank drafthead on this machine (CPU backend, Gloo, synthetic bf16 weights
# at the real shapes: K=5120, 4 x 32320 vocab rows), driven by the bundled load client, which
# prints its report. Usage: scripts/demo.sh [seconds of load, default 20]
set -euo pipefail
cd "$(dirname "$0")/.."
secs=${1:-20}
bash scripts/build.sh build -DDRAFTHEAD_CUDA=OFF
port=${DRAFTHEAD_PORT:-50051}
metrics=${DRAFTHEAD_METRICS_PORT:-9464}
log=$(mktemp /tmp/drafthead-demo-XXXX.log)
build/server/drafthead-server --tp=4 --backend=cpu --comm=gloo --synthetic=1 \
  --listen=127.0.0.1:$port --metrics-listen=127.0.0.1:$metrics 2>"$log" &
server=$!
trap 'kill $server 2>/dev/null; wait $server 2>/dev/null || true' EXIT
echo "starting 4 ranks (log: $log) ..."
if ! build/client/drafthead-client info --target=127.0.0.1:$port --wait=600; then
  echo "server did not come up:"; tail -20 "$log"; exit 1
fi
grep -E "event=(shard_ready|serving)" "$log" || true
echo
echo "== one M=5 request (FULL_LOGITS bf16 and TOP_K k=8), end to end =="
build/client/drafthead-client load --target=127.0.0.1:$port --rows=5 --mode=full -n 5 --concurrency=1
build/client/drafthead-client load --target=127.0.0.1:$port --rows=5 --mode=topk --k=8 -n 5 --concurrency=1
echo
echo "== load: ${secs}s, M=5 rows per request, concurrency 8, TOP_K k=8 =="
build/client/drafthead-client load --target=127.0.0.1:$port --rows=5 --mode=topk --k=8 \
  --concurrency=8 --duration=${secs}s --warmup=2s --html=/tmp/drafthead-demo-report.html
echo "(HTML report: /tmp/drafthead-demo-report.html; metrics: http://127.0.0.1:$metrics/metrics)"
kill -TERM $server
wait $server && echo "server drained and exited 0"
trap - EXIT
