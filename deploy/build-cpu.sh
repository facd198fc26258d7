#!/bin/bash
# deploy/build-cpu.sh: the build steps of the CPU-only image (Dockerfile targets cpu-builder/cpu,
# on plain debian:12), runnable outside Docker. It is deploy/build.sh with the CUDA backend off:
#   build-cpu.sh deps [--print]
#   build-cpu.sh build --src=DIR --build=DIR --stage=DIR [--jobs=N] [--prebuilt=BINARY_DIR] [--no-smoke]
# The Dockerfile RUNs exactly these two commands; tests/deploy_build_test.sh runs the second one
# (with --prebuilt, to reuse the CI build) so the image's steps are exercised on every CI run.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
cmd=${1:-}
shift || true
case "$cmd" in
  deps) exec bash "$here/build.sh" deps "$@" ;;
  build) exec bash "$here/build.sh" build --cuda=OFF "$@" ;;
  *) echo "usage: build-cpu.sh deps [--print] | build-cpu.sh build --src=DIR --build=DIR --stage=DIR [...]" >&2; exit 1 ;;
esac
