#!/bin/bash
# A tp=2 group on one GPU over NCCL (the hidden rows sent GPU to GPU: RankEngine's rows apart)
# against the same group over Gloo (rows in the host message): every answer compared bit for bit
# (bench/gpu/group_compare.py), then both under load with the stage table. NCCL refuses two ranks
# of one process on one GPU, so every rank of the NCCL group is a process of its own started by hand
# (--rank / --world / --leader) with its own NCCL_HOSTID, NCCL on sockets over loopback: right, not
# fast (multi-GPU timings need a multi-GPU machine). Here: `bench/gpu/bundle.sh`; on the GPU machine,
# from the repository root (carry `bundle-gpu`):
#
#   [SECS=2] [EXTRA="--hidden-size=64 --padded-vocab=4096"] bash bench/gpu/group.sh
#
# Without a GPU, to check the script itself (both groups over Gloo, this checkout's build instead
# of a bundle; PY: a Python with numpy):
#   DH_LOCAL=build BACKEND=cpu PY=/usr/bin/python3 EXTRA="--hidden-size=64 --padded-vocab=4096" bash bench/gpu/group.sh
set -uo pipefail
cd "$(dirname "$0")/../.."
if [ -n "${DH_LOCAL:-}" ]; then
  srv=$DH_LOCAL/server/drafthead-server
  cli=$DH_LOCAL/client/drafthead-client
  export PYTHONPATH="$DH_LOCAL/client/python/pkg${PYTHONPATH:+:$PYTHONPATH}"
else
  source bench/gpu/env.sh
  srv=$DH/bin/server/drafthead-server
  cli=$DH/bin/client/drafthead-client
fi
backend=${BACKEND:-cuda}
comm_a=nccl; [ "$backend" = cpu ] && comm_a=gloo
secs=${SECS:-2}
tmp=$(mktemp -d)
source bench/serving_lib.sh
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null; done
  wait 2>/dev/null
  rm -rf "$tmp"
}
trap cleanup EXIT
# shellcheck disable=SC2206
common=(--backend=$backend --synthetic=1 ${EXTRA:-})
[ "$backend" = cpu ] && common+=(--threads=1)

echo "# date: $(date -u '+%F %H:%M UTC'), $( (nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null || echo no GPU) | head -1)"
echo "# commit: ${DH_COMMIT:-$(git rev-parse --short HEAD 2>/dev/null)}; group A: tp=2 --comm=$comm_a, a process a rank; group B: tp=2 --comm=gloo (launched by rank 0)"

# Group A: one process a rank, each its own NCCL host id (NCCL then takes its socket transport).
port_a=$(port_pick); leader=127.0.0.1:$(port_pick)
for r in 0 1; do
  NCCL_HOSTID=node$r NCCL_NET=Socket NCCL_SOCKET_IFNAME=lo NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1 \
    "$srv" --listen=127.0.0.1:$port_a --rank=$r --world=2 --leader=$leader --comm=$comm_a "${common[@]}" \
    >"$tmp/a$r.log" 2>&1 &
  pids+=($!)
done
if ! "$cli" info --target=127.0.0.1:$port_a --wait=600 >/dev/null; then
  echo "group A did not start:"; tail -20 "$tmp"/a0.log "$tmp"/a1.log; exit 1
fi
# Group B: the usual launcher (rank 0 spawns rank 1), Gloo.
serve "$srv" "$tmp/b.log" --tp=2 --comm=gloo "${common[@]}" || exit 1
pids+=($pid)
port_b=$port

echo
${PY:-python3} bench/gpu/group_compare.py --a=127.0.0.1:$port_a --b=127.0.0.1:$port_b
status=$?

echo
point_header
for g in a b; do
  p=$port_a; [ $g = b ] && p=$port_b
  POINT_TARGET=127.0.0.1:$p point "$g: c=1 M=5 TOP_K k=8" --rows=5 --mode=topk --k=8 -c 1 --duration=${secs}s
  POINT_TARGET=127.0.0.1:$p point "$g: c=1 M=1 ARGMAX" --rows=1 --mode=argmax -c 1 --duration=${secs}s
  POINT_TARGET=127.0.0.1:$p point "$g: c=64 M=5 TOP_K k=8" --rows=5 --mode=topk --k=8 -c 64 --connections=4 --duration=${secs}s
done
grep -h "rows_apart\|group_failed\|error" "$tmp"/a*.log "$tmp"/b.log | head -5
exit $status
