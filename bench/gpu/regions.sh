#!/bin/bash
# Issue 13's table: the three ways in (bytes, POSIX region, CUDA IPC region) side by side in one
# run, tp = 1, full vocabulary, c = 1, M = 5: FULL_LOGITS bf16 and TOP_K k = 8, from the C++ load
# tester (drafthead-client load --shared-memory=...) and from a separate Python process with torch
# CUDA tensors (bench/gpu/regions_py.py, which first checks CUDA regions == bytes bit for bit, the
# DSpark adapter included). GEMV: the server's Timing.compute_us p50 in the same run.
#
# On the GPU machine, from the repository root:  bash bench/gpu/regions.sh (it sources env.sh)
# Here (no GPU), the non-GPU parts at small shapes: DH_REGIONS_CPU=1 bench/gpu/regions.sh build
# SECONDS_PER_POINT (default 5); PYTHON: the python3 with grpc, numpy (and torch). About 2 minutes on an H200.
set -euo pipefail
cd "$(dirname "$0")/../.."
secs=${SECONDS_PER_POINT:-5}
if [ "${DH_REGIONS_CPU:-0}" = 1 ]; then
  bin=${1:-build}
  srv=$bin/server/drafthead-server; cli=$bin/client/drafthead-client
  server_flags=(--backend=cpu --comm=gloo --synthetic=1 --hidden-size=256 --padded-vocab=4096 --shared-memory=system)
  kinds=(off system)
else
  source bench/gpu/env.sh
  srv=$DH/bin/server/drafthead-server; cli=$DH/bin/client/drafthead-client
  server_flags=(--backend=cuda --comm=nccl --synthetic=1 --shared-memory=system,cuda)
  kinds=(off system cuda)
fi
port=$((20000 + RANDOM % 20000)); target=127.0.0.1:$port
log=$(mktemp /tmp/regions_bench.XXXXXX.log); json=$(mktemp /tmp/regions_bench.XXXXXX.json)
"$srv" --tp=1 --listen=$target "${server_flags[@]}" 2>"$log" &
pid=$!
trap 'kill -TERM $pid 2>/dev/null; wait $pid 2>/dev/null || true; rm -f "$json"' EXIT
"$cli" info --target=$target --wait=600 >/dev/null || { tail -20 "$log"; exit 1; }

echo "date: $(date -u +%F), device: $(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1 || echo none), commit: ${DH_COMMIT:-unknown} (the bundle's)"
echo "server: --tp=1 ${server_flags[*]}; M = 5, c = 1, ${secs} s per C++ point"
echo
echo "| mode | client | way in | p50 us | p99 us | GEMV (compute_us p50) | p50 - GEMV |"
echo "| --- | --- | --- | --- | --- | --- | --- |"
gemv=0
for mode in full topk; do
  for kind in "${kinds[@]}"; do
    sm=$([ $kind = off ] && echo "" || echo $kind)
    "$cli" load --target=$target --rows=5 --mode=$mode --dtype=bf16 --k=8 --concurrency=1 \
      --duration=${secs}s --warmup=1s --shared-memory=$sm --quiet --json="$json"
    row=$(python3 - "$json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))['runs'][0]
lat, comp = r['latency_us'], r['server_us']['compute']
print(f"{lat['p50']:.0f} {lat['p99']:.0f} {comp['p50']:.0f} {r['errors']}")
PY
)
    read -r p50 p99 comp errs <<<"$row"
    [ "$errs" = 0 ] || echo "warning: $errs errors in $mode/$kind" >&2
    label=$([ $mode = full ] && echo "FULL_LOGITS bf16" || echo "TOP_K k=8")
    way=$([ $kind = off ] && echo bytes || echo $kind)
    echo "| $label | C++ | $way | $p50 | $p99 | $comp | $((p50 - comp)) |"
    [ $mode = full ] && gemv_full=$comp || gemv_topk=$comp
  done
done
${PYTHON:-python3} bench/gpu/regions_py.py $target 400 | python3 -c "
import json, sys
gemv = {'full_bf16': $gemv_full, 'topk8': $gemv_topk}
label = {'full_bf16': 'FULL_LOGITS bf16', 'topk8': 'TOP_K k=8'}
for line in sys.stdin:
    d = json.loads(line)
    if 'skip' in d:
        print(f'| Python rows skipped: {d[\"skip\"]} |||||||')
    elif 'check' in d:
        print(f'| check: {d[\"check\"]}: {\"ok\" if d[\"ok\"] else \"FAILED\"} |||||||', file=sys.stderr)
    else:
        g = gemv[d['mode']]
        print(f'| {label[d[\"mode\"]]} | Python (torch) | {d[\"way\"]} | {d[\"p50_us\"]:.0f} | {d[\"p99_us\"]:.0f} | {g} | {d[\"p50_us\"] - g:.0f} |')
"
echo
echo "targets (issue 13): FULL_LOGITS cuda p50 <= GEMV + 80 us (C++), + 150 us (Python); TOP_K hidden_region <= GEMV + 60 us (C++), + 120 us (Python)"
