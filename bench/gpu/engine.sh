#!/bin/bash
# Issue 22's engine table in one device command: one server flag on against off, two tp=1
# --comm=nccl servers (full vocabulary, synthetic weights) on the one GPU, measured alternately in
# ROUNDS rounds so both see the same machine. Only one server has work at a time (no time slicing
# between them). FLAG (default cuda-graphs): --cuda-graphs (captured graphs vs eager launches),
# --take-ahead (the next batch prepared during one vs after it), --launch-ahead (also launched
# behind it vs launched once the last one is done), --cuda-upload-aside (a batch launched behind
# another uploads its rows on a second stream vs in its own step), --cuda-stage-events (the stage
# timing events), --cuda-overlap-steps (the batch behind on a second stream) or --split-requests
# (batches end full, the request that does not fit split). Here:
# `bench/gpu/bundle.sh`; on the GPU machine, from the repository root (carry `bundle-gpu`):
#
#   ROUNDS=2 SECS=2 [FLAG=take-ahead|launch-ahead|cuda-upload-aside|cuda-stage-events|cuda-overlap-steps|split-requests] bash bench/gpu/engine.sh
#
# Points: gRPC unary c=1 M=5 TOP_K k=8, M=1 ARGMAX, M=64 TOP_K k=8 (one batch of 64 rows);
# c=64 M=5 TOP_K and FULL_LOGITS bf16 (4 connections); the lane (--lane=shm) c=1 M=5 TOP_K and M=1 ARGMAX, c=64 M=5
# TOP_K (one lane of depth 64). Columns are
# p50s in us (stages: the server's own, device events for h2d / gemv / epilogue / d2h). Then each
# server's drafthead_graph_batches_total and drafthead_ahead_batches_total against its batches.
# OLD=PATH instead: this bundle's server ("on") against an older drafthead-server binary ("off"),
# both with the same flags (FLAG unused; e.g. the previous bundle's, carried in bundle-gpu/old/).
# POINTS=REGEX: only the points whose label matches (e.g. POINTS=grpc).
# ON="--flags..." OFF="--flags..." instead of FLAG: any two flag sets (e.g. ON=--unary-api=sync
# OFF=--unary-api=callback). Rounds alternate which server goes first (on off, off on, ...): a
# fixed order read ~15 % slower for the second of two identical servers (session 19).
set -uo pipefail
cd "$(dirname "$0")/../.."
source bench/gpu/env.sh
srv=$DH/bin/server/drafthead-server
cli=$DH/bin/client/drafthead-client
secs=${SECS:-2}
flag_name=${FLAG:-cuda-graphs}
rounds=${ROUNDS:-2}
tmp=$(mktemp -d)
source bench/serving_lib.sh
declare -A ports pids mports
cleanup() {
  for g in on off; do [ -n "${pids[$g]:-}" ] && kill -TERM "${pids[$g]}" 2>/dev/null; done
  wait 2>/dev/null
  rm -rf "$tmp"
}
trap cleanup EXIT

echo "# date: $(date -u '+%F %H:%M UTC'), $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1)"
echo "# commit: ${DH_COMMIT:-unknown} (the bundle's)"

if [ -n "${OLD:-}" ]; then
  flag_name="new server"
  echo "# off: $OLD ($(stat -c %y "$OLD" | cut -c1-16)), on: this bundle's"
elif [ -n "${ON:-}${OFF:-}" ]; then
  flag_name="ON/OFF"
  echo "# on: ${ON:-(no flags)}, off: ${OFF:-(no flags)}"
fi
for g in on off; do
  flag=true; [ $g = off ] && flag=false
  mports[$g]=$(port_pick)
  prog=$srv flag_arg=--$flag_name=$flag
  [ -n "${OLD:-}" ] && flag_arg= && [ $g = off ] && prog=$OLD
  if [ -n "${ON:-}${OFF:-}" ]; then flag_arg=${ON:-}; [ $g = off ] && flag_arg=${OFF:-}; fi
  # shellcheck disable=SC2086
  serve "$prog" "$tmp/$g.log" --tp=1 --backend=cuda --comm=nccl --synthetic=1 --shared-memory=system --lanes=4 --max-rows=64 \
    $flag_arg --metrics-listen=127.0.0.1:${mports[$g]} || exit 1
  ports[$g]=$port
  pids[$g]=$pid
done

point_header
for ((r = 0; r < rounds; ++r)); do
  order="on off"; [ $((r % 2)) = 1 ] && order="off on"
  for spec in "grpc M=5 TOP_K|--rows=5 --mode=topk --k=8" "grpc M=1 ARGMAX|--rows=1 --mode=argmax" \
              "grpc M=5 TOP_K blocking client|--rows=5 --mode=topk --k=8 --client-api=blocking" \
              "grpc M=64 TOP_K|--rows=64 --mode=topk --k=8" \
              "grpc M=5 FULL bf16|--rows=5 --mode=full --dtype=bf16" \
              "grpc c=64 M=5 TOP_K|--rows=5 --mode=topk --k=8 --concurrency=64 --connections=4" \
              "grpc c=64 M=5 FULL bf16|--rows=5 --mode=full --dtype=bf16 --concurrency=64 --connections=4" \
              "lane M=5 TOP_K|--rows=5 --mode=topk --k=8 --lane=shm" "lane M=1 ARGMAX|--rows=1 --mode=argmax --lane=shm" \
              "lane c=64 M=5 TOP_K|--rows=5 --mode=topk --k=8 --lane=shm --concurrency=64"; do
    label=${spec%%|*}
    flags=${spec#*|}
    [[ -n ${POINTS:-} && ! $label =~ $POINTS ]] && continue
    for g in $order; do
      port=${ports[$g]}
      # shellcheck disable=SC2086
      point "$label, --$flag_name $g (round $r)" $flags --duration=${secs}s
      rps=$(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['runs'][0]['rows_per_s'])" "$tmp/point.json" 2>/dev/null || echo nan)
      echo "$label|$g|$p50|$rps" >>"$tmp/p50.txt"
    done
  done
done

echo; echo "### Medians over the rounds: --$flag_name on / off"
python3 - "$tmp/p50.txt" <<'PY'
import statistics, sys
v = {}
for line in open(sys.argv[1]):
    label, g, p, rps = line.rstrip('\n').split('|')
    v.setdefault(label, {}).setdefault(g, []).append((float(p), float(rps)))
print("| point | on p50 us | off p50 us | on / off | on rows/s | off rows/s | on / off |")
print("| --- | --- | --- | --- | --- | --- | --- |")
for label, d in v.items():
    a, b = (statistics.median(x[0] for x in d[k]) for k in ('on', 'off'))
    ra, rb = (statistics.median(x[1] for x in d[k]) for k in ('on', 'off'))
    print(f"| {label} | {a:.1f} | {b:.1f} | {a / b:.3f} | {ra:.0f} | {rb:.0f} | {ra / rb:.3f} |")
PY

echo; echo "### Batches replayed from a graph / taken ahead / launched ahead (drafthead_graph_batches_total, drafthead_ahead_batches_total, drafthead_launched_ahead_batches_total / drafthead_batches_total)"
for g in on off; do
  m=$(curl -s "http://127.0.0.1:${mports[$g]}/metrics" 2>/dev/null || python3 -c "import urllib.request,sys; print(urllib.request.urlopen('http://127.0.0.1:${mports[$g]}/metrics').read().decode())")
  echo "--$flag_name $g: $(echo "$m" | grep -E '^drafthead_(graph_|ahead_|launched_ahead_)?batches_total ' | tr '\n' ' ')"
done
# (pipefail: a grep that finds nothing would make the script's status 1 after a good run)
if ! grep -h "cuda_graph_capture_failed\|stage_timing_unavailable" "$tmp"/on.log "$tmp"/off.log | head -5; then
  echo "(no graph capture or stage timing warnings)"
fi
