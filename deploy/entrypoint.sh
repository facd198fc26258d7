#!/bin/bash
# drafthead-entrypoint: turns the container's DRAFTHEAD_* environment into drafthead-server flags,
# checks them (a clear message and exit 64 instead of a crash loop with an absl usage dump), then
# `exec`s the server so that it IS this process: SIGTERM from `docker stop` / the kubelet reaches
# the server directly and starts its drain; nothing sits between them to lose or delay it.
#
# No tini is needed for the server's own processes: with DRAFTHEAD_TP=N the server (rank 0) forks
# ranks 1..N-1 itself, waits for each (waitpid), and they die with it (PR_SET_PDEATHSIG). What a
# PID 1 without an init would NOT reap are strangers re-parented to it (e.g. an orphan of a killed
# `docker exec`); the health check below execs the client (no grandchild), and compose sets
# `init: true` anyway. See docs/operations.md, "Processes and signals".
#
# Usage (in the image this is the ENTRYPOINT):
#   entrypoint.sh [--extra-server-flag ...]     flags after the environment's; last one wins
#   entrypoint.sh PROGRAM [ARGS...]             runs another program (drafthead-client, bash) as is
# Outside a container: DRAFTHEAD_BIN=/path/to/drafthead-server (default: drafthead-server on PATH).
# DRAFTHEAD_DRY_RUN=1 prints the server's command line (one argument per line) instead of running it.
set -euo pipefail

prog=drafthead-entrypoint
die() {
  echo "$prog: error: $*" >&2
  exit 64  # EX_USAGE: distinct from the server's own failure codes (1, 2, 3)
}
warn() { echo "$prog: warning: $*" >&2; }

# A first argument that is not a flag is a program to run instead of the server.
if [ $# -gt 0 ] && [ "${1#-}" = "$1" ]; then
  exec "$@"
fi

# ---- value checks -------------------------------------------------------------------------------
is_uint() { [[ $1 =~ ^[0-9]+$ ]]; }
# An integer in [lo, hi] (decimal, no sign, at most 18 digits so bash arithmetic cannot overflow).
check_int() {  # NAME LO HI
  local v=${!1}
  [[ $v =~ ^[0-9]{1,18}$ ]] || die "$1='$v' is not a non-negative integer"
  v=$((10#$v))
  ((v >= $2 && v <= $3)) || die "$1=$v is out of range [$2, $3]"
}
# absl::Duration syntax as the server parses it: 0, inf, or number+unit groups ("90s", "1m30s", "250ms").
check_duration() {
  local v=${!1}
  [[ $v =~ ^(0|inf|([0-9]+(\.[0-9]+)?(ns|us|ms|s|m|h))+)$ ]] ||
    die "$1='$v' is not a duration (write e.g. 5s, 500ms, 1m30s, 2h; a bare number has no unit)"
}
# Seconds in a duration, rounded down (for the grace-period sanity check only).
duration_s() {
  local v=$1 total=0 num unit
  [ "$v" = inf ] && { echo 999999999; return; }
  [ "$v" = 0 ] && { echo 0; return; }
  while [[ $v =~ ^([0-9]+)(\.[0-9]+)?(ns|us|ms|s|m|h)(.*)$ ]]; do
    num=$((10#${BASH_REMATCH[1]})) unit=${BASH_REMATCH[3]} v=${BASH_REMATCH[4]}
    case $unit in h) total=$((total + num * 3600)) ;; m) total=$((total + num * 60)) ;; s) total=$((total + num)) ;; esac
  done
  echo "$total"
}
check_hostport() {  # HOST:PORT or [v6]:PORT; port 0 = any free port (tests)
  local v=${!1} port
  if [[ $v =~ ^\[[0-9A-Fa-f:.]+\]:([0-9]{1,5})$ ]] || [[ $v =~ ^[A-Za-z0-9_.-]*:([0-9]{1,5})$ ]]; then
    port=$((10#${BASH_REMATCH[1]}))
    ((port <= 65535)) || die "$1='$v': port $port is above 65535"
  else
    die "$1='$v' is not HOST:PORT (e.g. 0.0.0.0:50051, [::]:50051, drafthead-0.drafthead:29500)"
  fi
}
check_bool() {  # sets the variable named $2 to true/false
  case "${!1,,}" in
    1 | true | yes | on) printf -v "$2" true ;;
    0 | false | no | off) printf -v "$2" false ;;
    *) die "$1='${!1}' is not a boolean (use 1/0, true/false, yes/no)" ;;
  esac
}
check_enum() {  # NAME allowed...
  local name=$1 v=${!1} a
  shift
  for a in "$@"; do [ "$v" = "$a" ] && return 0; done
  die "$name='$v' must be one of: $*"
}
check_file() {
  [ -f "${!1}" ] || die "$1='${!1}': no such file (is the volume mounted?)"
  [ -r "${!1}" ] || die "$1='${!1}': not readable by uid $(id -u) (the image runs as a non-root user; chmod o+r or set fsGroup)"
}
check_word() { [[ ${!1} =~ ^[^[:space:]]+$ ]] || die "$1='${!1}' must be one non-empty word"; }

# ---- environment -> flags -----------------------------------------------------------------------
flags=()
# Flag names are passed with underscores (--max_rows): absl's parser takes only the C++ names, and
# underscores are accepted whether or not the server also maps the SPEC's dashed spelling
# (--max-rows). Flags from DRAFTHEAD_EXTRA_ARGS and the arguments are rewritten the same way.
set_flag() { flags+=("--${1//-/_}=$2"); }
underscore_flag() {  # --a-b=v -> --a_b=v (the name only; values keep their dashes)
  local a=$1 name rest=""
  [[ $a == --* ]] || { echo "$a"; return; }
  name=${a#--}
  if [[ $name == *=* ]]; then rest="=${name#*=}" name=${name%%=*}; fi
  echo "--${name//-/_}$rest"
}
is_set() { [ -n "${!1:-}" ]; }

# Weights: a checkpoint (file or directory) or synthetic weights, never both.
extra_words=()
if is_set DRAFTHEAD_EXTRA_ARGS; then
  # Split on whitespace only, never eval'd: a value cannot run commands. Values with spaces: pass
  # them as container arguments instead ("$@" below).
  read -r -a words <<<"$DRAFTHEAD_EXTRA_ARGS"
  for w in "${words[@]}"; do
    [[ $w == --?* ]] || die "DRAFTHEAD_EXTRA_ARGS: '$w' is not a --flag (values go as --flag=value)"
    extra_words+=("$(underscore_flag "$w")")
  done
fi
mentions() {  # FLAGNAME: given in EXTRA_ARGS or as an argument?
  local a
  for a in "${extra_words[@]}" "${cli_args[@]}"; do
    [[ $a == "--${1//-/_}" || $a == "--${1//-/_}="* ]] && return 0
  done
  return 1
}
cli_args=()
seen_dashdash=0
for a in "$@"; do
  if ((seen_dashdash)) || [ "$a" = -- ]; then seen_dashdash=1; cli_args+=("$a"); else cli_args+=("$(underscore_flag "$a")"); fi
done

if is_set DRAFTHEAD_WEIGHTS && is_set DRAFTHEAD_SYNTHETIC; then
  die "set DRAFTHEAD_WEIGHTS (a checkpoint) or DRAFTHEAD_SYNTHETIC (a seed), not both"
fi
if is_set DRAFTHEAD_WEIGHTS; then
  [ -e "$DRAFTHEAD_WEIGHTS" ] || die "DRAFTHEAD_WEIGHTS='$DRAFTHEAD_WEIGHTS': no such file or directory (is the weights volume mounted?)"
  [ -r "$DRAFTHEAD_WEIGHTS" ] || die "DRAFTHEAD_WEIGHTS='$DRAFTHEAD_WEIGHTS': not readable by uid $(id -u)"
  if [ -d "$DRAFTHEAD_WEIGHTS" ] && [ ! -e "$DRAFTHEAD_WEIGHTS/model.safetensors.index.json" ] &&
    ! compgen -G "$DRAFTHEAD_WEIGHTS/*.safetensors" >/dev/null; then
    die "DRAFTHEAD_WEIGHTS='$DRAFTHEAD_WEIGHTS' is a directory with neither model.safetensors.index.json nor *.safetensors"
  fi
  set_flag weights "$DRAFTHEAD_WEIGHTS"
elif is_set DRAFTHEAD_SYNTHETIC; then
  check_int DRAFTHEAD_SYNTHETIC 0 999999999999999999
  set_flag synthetic "$DRAFTHEAD_SYNTHETIC"
elif ! mentions weights && ! mentions synthetic; then
  die "no weights: set DRAFTHEAD_WEIGHTS=/weights/... (a .safetensors file or checkpoint directory) or DRAFTHEAD_SYNTHETIC=SEED"
fi
if is_set DRAFTHEAD_TENSOR; then check_word DRAFTHEAD_TENSOR; set_flag tensor "$DRAFTHEAD_TENSOR"; fi
if is_set DRAFTHEAD_TWIN; then
  check_file DRAFTHEAD_TWIN
  is_set DRAFTHEAD_SYNTHETIC && warn "DRAFTHEAD_TWIN with DRAFTHEAD_SYNTHETIC: the twin must have been made from the same synthetic seed and shapes"
  set_flag twin "$DRAFTHEAD_TWIN"
fi
if is_set DRAFTHEAD_HIDDEN_SIZE; then
  check_int DRAFTHEAD_HIDDEN_SIZE 32 1048576
  (($((10#$DRAFTHEAD_HIDDEN_SIZE)) % 32 == 0)) || die "DRAFTHEAD_HIDDEN_SIZE=$DRAFTHEAD_HIDDEN_SIZE must be a multiple of 32 (the twin's block width)"
  set_flag hidden-size "$DRAFTHEAD_HIDDEN_SIZE"
fi
if is_set DRAFTHEAD_PADDED_VOCAB; then check_int DRAFTHEAD_PADDED_VOCAB 1 100000000; set_flag padded-vocab "$DRAFTHEAD_PADDED_VOCAB"; fi
if is_set DRAFTHEAD_VOCAB_SIZE; then check_int DRAFTHEAD_VOCAB_SIZE 1 100000000; set_flag vocab-size "$DRAFTHEAD_VOCAB_SIZE"; fi

# Group shape: the whole group in this container (DRAFTHEAD_TP), or one rank of it.
rank_vars=0
for v in DRAFTHEAD_RANK DRAFTHEAD_WORLD DRAFTHEAD_LEADER; do is_set "$v" && rank_vars=$((rank_vars + 1)); done
if ((rank_vars > 0)); then
  ((rank_vars == 3)) || die "one rank per container needs all of DRAFTHEAD_RANK, DRAFTHEAD_WORLD and DRAFTHEAD_LEADER (got $rank_vars of 3)"
  check_int DRAFTHEAD_WORLD 1 64
  check_int DRAFTHEAD_RANK 0 $((10#$DRAFTHEAD_WORLD - 1))
  check_hostport DRAFTHEAD_LEADER
  if is_set DRAFTHEAD_TP && [ "$((10#$DRAFTHEAD_TP))" != "$((10#$DRAFTHEAD_WORLD))" ]; then
    die "DRAFTHEAD_TP=$DRAFTHEAD_TP differs from DRAFTHEAD_WORLD=$DRAFTHEAD_WORLD (unset DRAFTHEAD_TP for one rank per container)"
  fi
  set_flag rank "$((10#$DRAFTHEAD_RANK))"
  set_flag world "$((10#$DRAFTHEAD_WORLD))"
  set_flag leader "$DRAFTHEAD_LEADER"
elif is_set DRAFTHEAD_TP; then
  check_int DRAFTHEAD_TP 1 64
  set_flag tp "$((10#$DRAFTHEAD_TP))"
elif ! mentions tp && ! mentions rank; then
  die "set DRAFTHEAD_TP=N (the whole group of N ranks in this container) or DRAFTHEAD_RANK/DRAFTHEAD_WORLD/DRAFTHEAD_LEADER (one rank)"
fi
if is_set DRAFTHEAD_LOCAL_RANK; then check_int DRAFTHEAD_LOCAL_RANK 0 63; set_flag local-rank "$((10#$DRAFTHEAD_LOCAL_RANK))"; fi
if is_set DRAFTHEAD_BIND_HOST; then check_word DRAFTHEAD_BIND_HOST; set_flag bind-host "$DRAFTHEAD_BIND_HOST"; fi

backend=${DRAFTHEAD_BACKEND:-cpu} comm=${DRAFTHEAD_COMM:-gloo}
if is_set DRAFTHEAD_BACKEND; then check_enum DRAFTHEAD_BACKEND cpu cuda; set_flag backend "$backend"; fi
if is_set DRAFTHEAD_COMM; then check_enum DRAFTHEAD_COMM gloo nccl; set_flag comm "$comm"; fi
[ "$comm" = nccl ] && [ "$backend" != cuda ] && die "DRAFTHEAD_COMM=nccl needs DRAFTHEAD_BACKEND=cuda"
if is_set DRAFTHEAD_DEVICES; then
  [[ $DRAFTHEAD_DEVICES =~ ^[0-9]+(,[0-9]+)*$ ]] || die "DRAFTHEAD_DEVICES='$DRAFTHEAD_DEVICES' must be comma-separated CUDA device numbers, e.g. 0,1,2,3"
  set_flag devices "$DRAFTHEAD_DEVICES"
fi
if is_set DRAFTHEAD_THREADS; then check_int DRAFTHEAD_THREADS 0 4096; set_flag threads "$((10#$DRAFTHEAD_THREADS))"; fi

# Serving.
if is_set DRAFTHEAD_LISTEN; then check_hostport DRAFTHEAD_LISTEN; set_flag listen "$DRAFTHEAD_LISTEN"; fi
if is_set DRAFTHEAD_METRICS_LISTEN; then check_hostport DRAFTHEAD_METRICS_LISTEN; set_flag metrics-listen "$DRAFTHEAD_METRICS_LISTEN"; fi
if is_set DRAFTHEAD_MAX_ROWS; then check_int DRAFTHEAD_MAX_ROWS 1 256; set_flag max-rows "$((10#$DRAFTHEAD_MAX_ROWS))"; fi
if is_set DRAFTHEAD_MAX_TOP_K; then check_int DRAFTHEAD_MAX_TOP_K 1 1024; set_flag max-top-k "$((10#$DRAFTHEAD_MAX_TOP_K))"; fi
if is_set DRAFTHEAD_MAX_QUEUE_ROWS; then check_int DRAFTHEAD_MAX_QUEUE_ROWS 1 4294967295; set_flag max-queue-rows "$((10#$DRAFTHEAD_MAX_QUEUE_ROWS))"; fi
if is_set DRAFTHEAD_MAX_QUEUE_DELAY_US; then check_int DRAFTHEAD_MAX_QUEUE_DELAY_US 0 4294967295; set_flag max-queue-delay-us "$((10#$DRAFTHEAD_MAX_QUEUE_DELAY_US))"; fi
if is_set DRAFTHEAD_KEEP_BF16; then
  check_bool DRAFTHEAD_KEEP_BF16 keep
  set_flag keep-bf16 "$keep"
fi

# Timeouts and drain.
for pair in OP_TIMEOUT:op-timeout JOIN_TIMEOUT:join-timeout LOAD_TIMEOUT:load-timeout \
  DRAIN_GRACE:drain-grace DRAIN_TIMEOUT:drain-timeout; do
  var=DRAFTHEAD_${pair%%:*}
  if is_set "$var"; then check_duration "$var"; set_flag "${pair#*:}" "${!var}"; fi
done
# If the orchestrator's kill deadline is known, refuse a drain that cannot finish before SIGKILL.
if is_set DRAFTHEAD_TERMINATION_GRACE_SECONDS; then
  check_int DRAFTHEAD_TERMINATION_GRACE_SECONDS 1 86400
  need=$(($(duration_s "${DRAFTHEAD_DRAIN_GRACE:-0}") + $(duration_s "${DRAFTHEAD_DRAIN_TIMEOUT:-30s}")))
  ((need < 10#$DRAFTHEAD_TERMINATION_GRACE_SECONDS)) ||
    die "DRAFTHEAD_DRAIN_GRACE + DRAFTHEAD_DRAIN_TIMEOUT (${need}s) must be below the termination grace period (${DRAFTHEAD_TERMINATION_GRACE_SECONDS}s), or in-flight requests are cut by SIGKILL"
fi

# TLS: certificate and key together; a client CA turns on mutual TLS.
if is_set DRAFTHEAD_TLS_CERT || is_set DRAFTHEAD_TLS_KEY; then
  is_set DRAFTHEAD_TLS_CERT && is_set DRAFTHEAD_TLS_KEY || die "TLS needs both DRAFTHEAD_TLS_CERT and DRAFTHEAD_TLS_KEY"
  check_file DRAFTHEAD_TLS_CERT
  check_file DRAFTHEAD_TLS_KEY
  set_flag tls-cert "$DRAFTHEAD_TLS_CERT"
  set_flag tls-key "$DRAFTHEAD_TLS_KEY"
fi
if is_set DRAFTHEAD_TLS_CLIENT_CA; then
  is_set DRAFTHEAD_TLS_CERT || die "DRAFTHEAD_TLS_CLIENT_CA (mutual TLS) needs DRAFTHEAD_TLS_CERT and DRAFTHEAD_TLS_KEY"
  check_file DRAFTHEAD_TLS_CLIENT_CA
  set_flag tls-client-ca "$DRAFTHEAD_TLS_CLIENT_CA"
fi

if is_set DRAFTHEAD_RESTART; then
  check_enum DRAFTHEAD_RESTART no on-failure
  # In a container the orchestrator restarts (and counts restarts, and backs off); a supervisor
  # inside would hide crash loops from it. Allowed, for bare metal, but said.
  [ "$DRAFTHEAD_RESTART" = on-failure ] && [ -f /.dockerenv -o -n "${KUBERNETES_SERVICE_HOST:-}" ] &&
    warn "DRAFTHEAD_RESTART=on-failure inside a container: the orchestrator's restart policy is usually the better supervisor"
  set_flag restart "$DRAFTHEAD_RESTART"
fi
if is_set DRAFTHEAD_LOG_LEVEL; then check_enum DRAFTHEAD_LOG_LEVEL debug info warn error; set_flag log-level "$DRAFTHEAD_LOG_LEVEL"; fi

# Unknown DRAFTHEAD_* names are most often typos (DRAFTHEAD_MAXROWS): say so, but do not fail, since
# Kubernetes injects DRAFTHEAD_SERVICE_HOST, DRAFTHEAD_PORT... for a Service named "drafthead"
# (our manifests set enableServiceLinks: false).
known=" WEIGHTS TENSOR TWIN SYNTHETIC HIDDEN_SIZE PADDED_VOCAB VOCAB_SIZE TP RANK WORLD LEADER LOCAL_RANK
  BIND_HOST BACKEND COMM DEVICES THREADS LISTEN METRICS_LISTEN MAX_ROWS MAX_TOP_K MAX_QUEUE_ROWS
  MAX_QUEUE_DELAY_US KEEP_BF16 OP_TIMEOUT JOIN_TIMEOUT LOAD_TIMEOUT DRAIN_GRACE DRAIN_TIMEOUT
  TERMINATION_GRACE_SECONDS TLS_CERT TLS_KEY TLS_CLIENT_CA RESTART LOG_LEVEL EXTRA_ARGS BIN CLIENT
  DRY_RUN HEALTH_WAIT HEALTH_TARGET HEALTH_TLS_CA HEALTH_TLS_CERT HEALTH_TLS_KEY HEALTH_TLS_SERVER_NAME
  BIN_DIR SOURCE_DIR "
# A here-string, not a process substitution: the substitution's process is not waited for and
# would survive the exec below as an unreaped child of the server.
drafthead_vars=$(env | grep -E '^DRAFTHEAD_[A-Z0-9_]*=' || true)
while IFS='=' read -r name _; do
  [ -n "$name" ] || continue
  short=${name#DRAFTHEAD_}
  case "$known" in *[[:space:]]"$short"[[:space:]]*) continue ;; esac
  if [[ $short =~ (_SERVICE_HOST|_SERVICE_PORT|^PORT|_PORT_) ]]; then
    warn "ignoring $name (a Kubernetes service link; set enableServiceLinks: false)"
  else
    warn "ignoring unknown variable $name (a typo? known: see docs/operations.md)"
  fi
done <<<"$drafthead_vars"

# NCCL in a container needs a large /dev/shm and unlimited locked memory; catch the Docker
# defaults (64 MB, 8 MB) here rather than as an opaque "unhandled system error" at the first batch.
if [ "$comm" = nccl ]; then
  if [ "$(ulimit -l)" != unlimited ]; then
    warn "locked-memory limit is $(ulimit -l) KB; NCCL wants unlimited (compose: ulimits: memlock: -1; docker run --ulimit memlock=-1)"
  fi
  shm_kb=$(df -Pk /dev/shm 2>/dev/null | awk 'NR==2 {print $2}')
  if [ -n "$shm_kb" ] && ((shm_kb < 1048576)); then
    warn "/dev/shm is only $((shm_kb / 1024)) MB; NCCL needs more (compose: shm_size: 16gb; Kubernetes: a Memory emptyDir on /dev/shm)"
  fi
fi

bin=${DRAFTHEAD_BIN:-}
if [ -z "$bin" ]; then
  bin=$(command -v drafthead-server) || die "drafthead-server is not on PATH; set DRAFTHEAD_BIN=/path/to/drafthead-server"
fi
[ -x "$bin" ] || die "DRAFTHEAD_BIN='$bin' is not an executable file"

cmd=("$bin" "${flags[@]}" "${extra_words[@]}" "${cli_args[@]}")
if [ "${DRAFTHEAD_DRY_RUN:-0}" = 1 ]; then
  printf '%s\n' "${cmd[@]}"
  exit 0
fi
echo "$prog: exec ${cmd[*]}" >&2
exec "${cmd[@]}"
