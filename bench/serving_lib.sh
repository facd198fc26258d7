# Sourced by bench/serving_bench.sh (CPU) and bench/gpu/serving.sh (GPU): start a server, run one
# load point, print it as a Markdown row with the server's stage breakdown. Callers set `srv`,
# `cli` and `fake` (program paths) and `tmp` (a scratch folder).

port_pick() { echo $((20000 + RANDOM % 20000)); }

# serve PROGRAM LOG FLAGS...: starts PROGRAM on a free loopback port (sets port, pid) and waits
# until it is SERVING (10 minutes at most: synthesis and the twin at real shapes take seconds).
# With SERVE_UNIX=PATH it listens on unix:PATH instead (point then needs POINT_TARGET=unix:PATH).
serve() {
  local prog=$1 log=$2
  shift 2
  port=$(port_pick)
  local addr=127.0.0.1:$port
  [ -n "${SERVE_UNIX:-}" ] && addr=unix:$SERVE_UNIX
  "$prog" --listen=$addr "$@" >"$log" 2>&1 &
  pid=$!
  if ! "$cli" info --target=$addr --wait=600 >/dev/null; then
    echo "server did not start: $prog $* (log $log):" >&2
    tail -20 "$log" >&2
    kill -TERM $pid 2>/dev/null || true
    return 1
  fi
}
unserve() { kill -TERM $pid 2>/dev/null || true; wait $pid 2>/dev/null || true; }

# point LABEL CLIENT_FLAGS...: one closed-loop load run against 127.0.0.1:$port (or POINT_TARGET); prints
# "| LABEL | p50 | p99 | rows/s | errors | queue | compute | stages... |" (us, p50s) and leaves the
# p50 in $p50.
point() {
  local label=$1
  shift
  rm -f "$tmp/point.json"  # a failed run must not leave the last point's figures behind
  "$cli" load --target=${POINT_TARGET:-127.0.0.1:$port} --warmup=1s --json="$tmp/point.json" --quiet "$@" >/dev/null
  local row
  row=$(python3 - "$tmp/point.json" "$label" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))['runs'][0]
lat, srv, st = r['latency_us'], r['server_us'], r.get('server_stages_us', {})
names = ['validate', 'broadcast', 'h2d', 'gemv', 'epilogue', 'gather', 'd2h', 'combine', 'server']
stages = ' | '.join(f"{st[n]['p50']:.0f}" if n in st else '-' for n in names)
print(f"{lat['p50']:.1f}||| {sys.argv[2]} | {lat['p50']:.1f} | {lat['p99']:.1f} | {r['rows_per_s']:.0f} | "
      f"{r['errors']} | {srv['queue']['p50']:.0f} | {srv['compute']['p50']:.0f} | {stages} |")
PY
)
  p50=${row%%||*}
  echo "${row#*||}"
}

point_header() {
  echo "| point | p50 us | p99 us | rows/s | errors | queue | compute | validate | broadcast | h2d | gemv | epilogue | gather | d2h | combine | server |"
  echo "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"
}
