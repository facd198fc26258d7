#!/bin/bash
# build.sh [BUILD_DIR] [extra cmake args...]: configures and builds drafthead (CPU-only unless
# CUDA is found; pass -DDRAFTHEAD_CUDA=OFF|ON to choose).
set -euo pipefail
cd "$(dirname "$0")/.."
dir=${1:-build}; shift || true
bash scripts/setup-deps.sh
cmake -S . -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo "$@" >/dev/null
cmake --build "$dir" -j"$(nproc)"
