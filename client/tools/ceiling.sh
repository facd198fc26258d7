#!/bin/bash
# Measures the load tester's ceiling: drafthead-fake-server (answers at once) pinned to some cores,
# drafthead-client load pinned to others, closed loop unary and streaming, then open loop rates.
# Usage: client/tools/ceiling.sh BUILD_DIR [SERVER_CORES] [CLIENT_CORES]   (loopback only, ~90 s)
set -euo pipefail
BIN=${1:?build dir}/client
SERVER_CORES=${2:-0-7}
CLIENT_CORES=${3:-8}
PORT_FILE=$(mktemp -u /tmp/dh-ceiling-XXXXXX)
taskset -c "$SERVER_CORES" "$BIN/drafthead-fake-server" --port-file="$PORT_FILE" --exit-after-s=300 >/dev/null 2>&1 &
SERVER=$!
trap 'kill $SERVER 2>/dev/null; rm -f "$PORT_FILE"' EXIT
for _ in $(seq 100); do [ -s "$PORT_FILE" ] && break; sleep 0.05; done
T=--target=127.0.0.1:$(cat "$PORT_FILE")
for a in "-c 64 --connections=2" "-c 128 --connections=4" "-c 256 --connections=8" \
         "-c 256 --connections=4 --stream --streams=8"; do
  echo "== closed loop $a (client cores $CLIENT_CORES)"
  /usr/bin/time -f "client cpu: user %U s, sys %S s, wall %e s" taskset -c "$CLIENT_CORES" \
    "$BIN/drafthead-client" load $T $a -z 5s --warmup=1s --mode=argmax --rows=5 2>&1 | grep -E "requests|throughput|latency us|cpu"
done
for r in 10000 20000 40000; do
  echo "== open loop --rps=$r"
  taskset -c "$CLIENT_CORES" "$BIN/drafthead-client" load $T --rps=$r --connections=4 -z 4s --warmup=1s --mode=argmax \
    --rows=5 | grep -E "requests|throughput|latency us|lag"
done
