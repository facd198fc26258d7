#!/usr/bin/env bash
# perf_analyzer and Triton's C++ client library (built by build_triton_clients.sh) against a CPU
# drafthead-server at the real shapes (tp 4, K 5120, 129280 rows, synthetic weights), then
# drafthead-client load on the same server at the same point, for docs/client.md. Not part of CI.
#
#   tests/interop/run_perf_analyzer.sh BUILD_DIR TRITON_OUT [REPORT_DIR]
#
# The point: M = 5 rows of finite bf16 values (a JSON file, base64 content: perf_analyzer cannot
# write bf16 from a list), mode top_k, k = 8, every output requested (perf_analyzer's habit),
# concurrency 1..8, unary then --streaming. Env: PA_INTERVAL_MS (5000), PA_STABILITY (50, percent;
# the build machine is shared, so the default 10 rarely settles), LOAD_SECONDS (8).
set -euo pipefail
build=${1:?BUILD_DIR}; triton=${2:?TRITON_OUT}; report=${3:-$(mktemp -d /tmp/pa_report.XXXXXX)}
mkdir -p "$report"
srv=$build/server/drafthead-server; cli=$build/client/drafthead-client
pa=$triton/bin/perf_analyzer; check=$triton/bin/triton_grpc_check
port=$((20000 + RANDOM % 20000)); target=127.0.0.1:$port
"$srv" --backend=cpu --comm=gloo --synthetic=1 --tp=4 --shared-memory=system --listen=$target \
  2>"$report/server.log" &
pid=$!
trap 'kill -TERM $pid 2>/dev/null; wait $pid 2>/dev/null || true' EXIT
"$cli" info --target=$target --wait=900 >"$report/info.txt"

/usr/bin/python3 - "$report/input.json" <<'PY'
import base64, json, sys
import numpy as np
x = np.random.default_rng(20).standard_normal((5, 5120)).astype(np.float32)
u = x.view(np.uint32)
bf16 = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)  # round to nearest even
json.dump({"data": [{"hidden": {"content": {"b64": base64.b64encode(bf16.tobytes()).decode()},
                                "shape": [5, 5120]}}]}, open(sys.argv[1], "w"))
PY
{
  echo "date: $(date -u '+%F %H:%M') UTC, host: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)"
  echo "load average at start: $(cut -d' ' -f1-3 /proc/loadavg)"
  echo "triton sources: client $(cut -c1-8 "$triton/src/client.commit"), common $(cut -c1-8 "$triton/src/common.commit"), perf_analyzer $(cut -c1-8 "$triton/src/perf_analyzer.commit")"
} | tee "$report/header.txt"

echo "== triton_grpc_check (Triton's C++ gRPC client library)" | tee "$report/check.txt"
"$check" "$target" | tee -a "$report/check.txt" || true

common=(-i grpc -u "$target" -m drafthead --input-data "$report/input.json"
        --request-parameter mode:top_k:string --request-parameter top_k:8:int
        --concurrency-range 1:8 -p "${PA_INTERVAL_MS:-5000}" -s "${PA_STABILITY:-50}" --max-trials 10)
for call in unary streaming; do
  extra=(); [ $call = streaming ] && extra=(--streaming)
  echo "== perf_analyzer $call: $(basename "$pa") ${common[*]} ${extra[*]}" | tee "$report/pa_$call.txt"
  "$pa" "${common[@]}" "${extra[@]}" -f "$report/pa_$call.csv" 2>&1 | tee -a "$report/pa_$call.txt" || true
done

for call in unary stream; do
  extra=(); [ $call = stream ] && extra=(--stream)
  for c in 1 2 4 8; do
    "$cli" load --target=$target --protocol=kserve --rows=5 --mode=topk --k=8 --concurrency=$c \
      --duration="${LOAD_SECONDS:-8}s" --warmup=1s --quiet --json="$report/load_${call}_$c.json" "${extra[@]}"
  done
done
/usr/bin/python3 - "$report" <<'PY'
import json, sys, os
d = sys.argv[1]
print("| drafthead-client load --protocol=kserve | concurrency | requests/s | p50 ms | p99 ms | queue p50 us | compute p50 us |")
print("| --- | --- | --- | --- | --- | --- | --- |")
for call in ("unary", "stream"):
    for c in (1, 2, 4, 8):
        r = json.load(open(os.path.join(d, f"load_{call}_{c}.json")))["runs"][0]
        print(f"| {call} | {c} | {r['requests_per_s']:.1f} | {r['latency_us']['p50'] / 1000:.1f} | "
              f"{r['latency_us']['p99'] / 1000:.1f} | {r['server_us']['queue']['p50']:.0f} | "
              f"{r['server_us']['compute']['p50']:.0f} |")
PY
echo "load average at end: $(cut -d' ' -f1-3 /proc/loadavg)"
echo "report: $report"
