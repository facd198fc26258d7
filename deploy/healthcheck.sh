#!/bin/bash
# drafthead-healthcheck: the image's HEALTHCHECK (and a Kubernetes exec probe where the native
# gRPC probe cannot be used: with TLS, since the kubelet's gRPC probe speaks plaintext only).
# Asks rank 0's grpc.health.v1 service through drafthead-client, which exits 0 only on SERVING:
# SERVING means every rank has its shard; a failed group reports NOT_SERVING, then exits.
#
# The target is derived from DRAFTHEAD_LISTEN (the same variable the entrypoint maps to --listen):
# a wildcard host (0.0.0.0, [::], empty) is probed on loopback. DRAFTHEAD_HEALTH_TARGET overrides.
# TLS: DRAFTHEAD_HEALTH_TLS_CA (the CA that signed the server's certificate), DRAFTHEAD_HEALTH_TLS_CERT
# and _KEY for mutual TLS, and DRAFTHEAD_HEALTH_TLS_SERVER_NAME (a name in the certificate, since
# the probe dials 127.0.0.1).
#
# The client is exec'd, not run as a child: if Docker kills a probe that overran its timeout,
# no orphan is left for PID 1 (the server, which reaps only its own ranks) to inherit.
set -euo pipefail

# A worker of the one-rank-per-container form has no gRPC port: its liveness is its process
# (a worker whose group failed exits non-zero and is restarted).
if [ -n "${DRAFTHEAD_RANK:-}" ] && [ "$((10#${DRAFTHEAD_RANK}))" != 0 ]; then
  exit 0
fi

target=${DRAFTHEAD_HEALTH_TARGET:-}
if [ -z "$target" ]; then
  listen=${DRAFTHEAD_LISTEN:-127.0.0.1:50051}
  port=${listen##*:}
  host=${listen%:*}
  case "$host" in
    "" | 0.0.0.0 | "[::]" | "::") host=127.0.0.1 ;;
  esac
  target=$host:$port
fi

args=(info "--target=$target" "--wait=${DRAFTHEAD_HEALTH_WAIT:-5s}" --attempts=1)
if [ -n "${DRAFTHEAD_HEALTH_TLS_CA:-}" ]; then args+=("--tls-ca=$DRAFTHEAD_HEALTH_TLS_CA"); fi
if [ -n "${DRAFTHEAD_HEALTH_TLS_CERT:-}" ]; then
  args+=("--tls-cert=$DRAFTHEAD_HEALTH_TLS_CERT" "--tls-key=${DRAFTHEAD_HEALTH_TLS_KEY:?DRAFTHEAD_HEALTH_TLS_KEY goes with DRAFTHEAD_HEALTH_TLS_CERT}")
fi
if [ -n "${DRAFTHEAD_HEALTH_TLS_SERVER_NAME:-}" ]; then args+=("--tls-server-name=$DRAFTHEAD_HEALTH_TLS_SERVER_NAME"); fi
if [ -n "${DRAFTHEAD_TLS_CERT:-}" ] && [ -z "${DRAFTHEAD_HEALTH_TLS_CA:-}" ]; then
  echo "drafthead-healthcheck: the server serves TLS; set DRAFTHEAD_HEALTH_TLS_CA (and _SERVER_NAME)" >&2
  exit 1
fi

client=${DRAFTHEAD_CLIENT:-}
if [ -z "$client" ]; then client=$(command -v drafthead-client) || {
  echo "drafthead-healthcheck: drafthead-client not on PATH (set DRAFTHEAD_CLIENT)" >&2
  exit 1
}; fi
# stdout (the ModelInfo) is not wanted in `docker inspect`'s health log; errors are.
exec "$client" "${args[@]}" >/dev/null
