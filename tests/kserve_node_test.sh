#!/usr/bin/env bash
# Runs kserve_node_test.js: installs @grpc/grpc-js and @grpc/proto-loader (pinned) from the npm
# registry into a cache folder in the build tree on first use, then runs the test with them.
# Skips (exit 77) only when node/npm is missing or npm cannot install.
set -u
cache="${DRAFTHEAD_BIN_DIR:?}/kserve_node"
pkgs=(@grpc/grpc-js@1.14.7 @grpc/proto-loader@0.8.1)
if ! command -v node >/dev/null || ! command -v npm >/dev/null; then
  echo "SKIP kserve_node_test: node and npm are needed (not on PATH)"
  exit 77
fi
if [[ ! -f "$cache/node_modules/@grpc/grpc-js/package.json" || ! -f "$cache/node_modules/@grpc/proto-loader/package.json" ]]; then
  mkdir -p "$cache"
  if ! timeout 300 npm install --prefix "$cache" --no-audit --no-fund --no-package-lock "${pkgs[@]}" >"$cache/npm.log" 2>&1; then
    echo "SKIP kserve_node_test: npm could not install ${pkgs[*]} (log below)"
    tail -20 "$cache/npm.log"
    exit 77
  fi
fi
exec env NODE_PATH="$cache/node_modules" node "$(dirname "$0")/kserve_node_test.js"
