#!/bin/bash
# Serving benchmarks on this machine. Prints Markdown tables.
#
#   bench/serving_bench.sh overhead [BUILD_DIR] [SECONDS_PER_POINT] [PAIRS]
#     Issue 11's CPU target: a trivial head (K=64, 256 rows, synthetic) at c=1 against
#     drafthead-fake-server (an instant answer: gRPC and the client alone) in the same run, tp=1
#     and tp=2 over Gloo (its TCP pairs, then its same-host Unix-socket links), M=1 ARGMAX and M=5
#     TOP_K k=8, unary and stream; p50 ratios and the server's stage breakdown (Timing). Each point
#     alternates fake and drafthead PAIRS times (default 3) and compares the median p50s: on a
#     shared 2-core host single p50s move by 20-50% from run to run.
#   bench/serving_bench.sh ab SERVER_A SERVER_B [ROUNDS] [SECONDS_PER_POINT] [BUILD_DIR]
#     Two drafthead-server builds (before / after a change) alternated ROUNDS times (default 3) on
#     the same load: tp=1 CPU, K=64 over the full 129280-row vocabulary (the payload at its real
#     size, the GEMV small), c=64 M=5 FULL_LOGITS bf16 and TOP_K k=8; rows/s a round and the medians.
#   bench/serving_bench.sh [BUILD_DIR] [SECONDS_PER_POINT] [SOAK_SECONDS]
#     Issue 4's figures: a tp=4 CPU group at the real shapes (synthetic weights), M=5 TOP_K k=8
#     requests at concurrency 1, 8, 64, with batching on (default) and off
#     (--max-batch-requests=1); then a soak at concurrency 32 with rank 0's RSS before and after.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "${1:-}" = lane ]; then
  # Issue 21's CPU target: the same trivial head at c=1, gRPC unary vs the same-host lane, C++
  # (drafthead-client load --lane=off|shm) and Python (bench/python_client_bench.py --lane),
  # alternating PAIRS times; median p50s and their ratio (target: lane <= 1/5 of gRPC).
  # PY_BEFORE=<dir of a staged drafthead_client package> adds its Python rows (see below).
  build=${2:-build}; secs=${3:-3}; pairs=${4:-3}
  srv=$build/server/drafthead-server; cli=$build/client/drafthead-client
  tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
  source bench/serving_lib.sh
  echo "date: $(date -u '+%F %H:%M UTC'), host: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)"
  serve "$srv" "$tmp/srv.log" --tp=1 --backend=cpu --comm=gloo --threads=1 --synthetic=1 --hidden-size=64 \
    --padded-vocab=256 --shared-memory=system --lanes=4
  point_header
  rows=()
  for m in "argmax M=1|--rows=1 --mode=argmax" "topk M=5 k=8|--rows=5 --mode=topk --k=8"; do
    grpc=() lane=()
    for ((i = 0; i < pairs; i++)); do
      point "grpc ${m%%|*}" ${m#*|} --lane=off --concurrency=1 --duration=${secs}s
      grpc+=("$p50")
      point "lane ${m%%|*}" ${m#*|} --lane=shm --concurrency=1 --duration=${secs}s
      lane+=("$p50")
    done
    rows+=("$(python3 -c "
import statistics as st
g = [float(v) for v in '${grpc[*]}'.split()]; l = [float(v) for v in '${lane[*]}'.split()]
print(f'| C++ | ${m%%|*} | {st.median(g):.1f} | {st.median(l):.1f} | {st.median(l) / st.median(g):.3f} |')")")
  done
  # The build's staged package (drafthead_client with its stubs and its own libdrafthead_lane.so);
  # with PY_BEFORE=<another staged package>, that one too against the same server, alternating
  # round by round (a change to the Python client, before vs after, in one run).
  pkgs=("Python (numpy)=$build/client/python/pkg")
  [ -n "${PY_BEFORE:-}" ] && pkgs+=("Python (numpy), PY_BEFORE=$PY_BEFORE")
  py=
  for ((i = 0; i < pairs; i++)); do
    for pkg in "${pkgs[@]}"; do
      out=$(PYTHONPATH=${pkg#*=} /usr/bin/python3 bench/python_client_bench.py --target=127.0.0.1:$port --device=numpy \
            --seconds=$secs --cases=argmax1,topk5 --lane=off,required --rounds=1)
      echo "${pkg%%=*}:"; echo "$out"
      py+=$(echo "$out" | grep '^| M=' | sed "s/^/${pkg%%=*}/")$'\n'
    done
  done
  unserve
  echo
  echo "| client | request | gRPC unary p50 us (median of $pairs) | lane p50 us (median of $pairs) | lane / gRPC |"
  echo "| --- | --- | --- | --- | --- |"
  printf '%s\n' "${rows[@]}"
  echo -n "$py" | python3 -c "
import sys, statistics as st
by = {}
for line in sys.stdin:
    who, _, rest = line.partition('| M=')
    r = ('| M=' + rest).split('|')
    by.setdefault((who, r[1].strip(), r[2].strip()), []).append(float(r[4]))
for who, case in dict.fromkeys(k[:2] for k in by):
    g, l = st.median(by[(who, case, 'off')]), st.median(by[(who, case, 'required')])
    print(f'| {who} | {case} | {g:.1f} | {l:.1f} | {l / g:.3f} |')"
  exit 0
fi
if [ "${1:-}" = ab ]; then
  a=$2; b=$3; rounds=${4:-3}; secs=${5:-3}; build=${6:-build}
  cli=$build/client/drafthead-client
  tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
  source bench/serving_lib.sh
  echo "date: $(date -u '+%F %H:%M UTC'), host: $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg)"
  echo "| round | server | point | rows/s | p50 us | errors |"
  echo "| --- | --- | --- | --- | --- | --- |"
  : >"$tmp/rows.txt"
  for ((r = 0; r < rounds; r++)); do
    for which in A B; do
      srv=$a; [ $which = B ] && srv=$b
      serve "$srv" "$tmp/srv.log" --tp=1 --backend=cpu --comm=gloo --threads=1 --synthetic=1 --hidden-size=64
      for pt in "c=64 M=5 FULL bf16|--mode=full --dtype=bf16" "c=64 M=5 TOP_K k=8|--mode=topk --k=8"; do
        # shellcheck disable=SC2086
        "$cli" load --target=127.0.0.1:$port -c 64 --rows=5 ${pt#*|} --warmup=1s --duration=${secs}s \
          --json="$tmp/p.json" --quiet >/dev/null
        python3 - "$tmp/p.json" "$r" "$which" "${pt%%|*}" "$tmp/rows.txt" <<'PY'
import json, sys
run = json.load(open(sys.argv[1]))['runs'][0]
r, who, point, rows = sys.argv[2:6]
print(f"| {r} | {who} | {point} | {run['rows_per_s']:.0f} | {run['latency_us']['p50']:.0f} | {run.get('errors', 0)} |")
open(rows, 'a').write(f"{who}|{point}|{run['rows_per_s']}\n")
PY
      done
      unserve
    done
  done
  echo
  echo "A = $a, B = $b"
  python3 - "$tmp/rows.txt" <<'PY'
import statistics as st, sys
by = {}
for line in open(sys.argv[1]):
    who, point, rps = line.strip().split('|')
    by.setdefault(point, {}).setdefault(who, []).append(float(rps))
print("| point | A rows/s (median) | B rows/s (median) | B / A |")
print("| --- | --- | --- | --- |")
for point, d in by.items():
    a, b = st.median(d['A']), st.median(d['B'])
    print(f"| {point} | {a:.0f} | {b:.0f} | {b / a:.3f} |")
PY
  exit 0
fi
if [ "${1:-}" = overhead ]; then
  build=${2:-build}; secs=${3:-5}; pairs=${4:-3}
  srv=$build/server/drafthead-server; cli=$build/client/drafthead-client
  fake=$build/client/drafthead-fake-server
  tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
  source bench/serving_lib.sh
  echo "date: $(date -u '+%F %H:%M UTC'), host: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)"
  shapes=(--hidden-size=64 --padded-vocab=256)
  modes=("argmax M=1|--rows=1 --mode=argmax" "topk M=5 k=8|--rows=5 --mode=topk --k=8")
  # The fake serves beside drafthead; each drafthead point runs right after the same point against
  # the fake, so both see the same machine load (this 2-core host is shared).
  serve "$fake" "$tmp/fake.log" --hidden-size=64 --vocab-size=256
  fake_port=$port fake_pid=$pid
  ratios=()
  point_header
  for cfg in "1|tp=1|" "2|tp=2 tcp|--same-host-links=false" "2|tp=2 unix|--same-host-links=true"; do
    IFS='|' read -r tp name links <<<"$cfg"
    serve "$srv" "$tmp/srv$tp.log" --tp=$tp --backend=cpu --comm=gloo --threads=1 --synthetic=1 "${shapes[@]}" $links
    for m in "${modes[@]}"; do
      for s in unary stream; do
        flag=; [ $s = stream ] && flag=--stream
        srv_port=$port
        fakes=() ours=()
        for ((i = 0; i < pairs; i++)); do
          port=$fake_port
          point "fake ${m%%|*} $s" ${m#*|} $flag --concurrency=1 --duration=${secs}s
          fakes+=("$p50")
          port=$srv_port
          point "$name ${m%%|*} $s" ${m#*|} $flag --concurrency=1 --duration=${secs}s
          ours+=("$p50")
        done
        ratios+=("$(python3 -c "
import statistics as st, sys
f = [float(v) for v in '${fakes[*]}'.split()]; d = [float(v) for v in '${ours[*]}'.split()]
mf, md = st.median(f), st.median(d)
print(f'| $name | ${m%%|*} | $s | {mf:.1f} | {md:.1f} | {md / mf:.2f}x |')")")
      done
    done
    unserve
  done
  pid=$fake_pid
  unserve
  echo
  echo "| tp | request | call | fake p50 us (median of $pairs) | drafthead p50 us (median of $pairs) | ratio |"
  echo "| --- | --- | --- | --- | --- | --- |"
  printf '%s\n' "${ratios[@]}"
  exit 0
fi
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
