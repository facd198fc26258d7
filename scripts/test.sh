#!/bin/bash
# The whole test suite: set-up, the CPU build and its tests, the libFuzzer target for a bounded
# time, the sanitizer build's unit tests, and (where nvcc exists) a CUDA build that must compile
# and link (its GPU tests skip without a GPU).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup-deps.sh
jobs=$(nproc)
echo "== CPU build =="
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DDRAFTHEAD_CUDA=OFF >/dev/null
cmake --build build -j"$jobs"
echo "== tests =="
ctest --test-dir build --output-on-failure -j"$jobs" --timeout 900
if [ -x /usr/local/cuda/bin/nvcc ] && [ "${DRAFTHEAD_SKIP_CUDA_BUILD:-0}" != 1 ]; then
  echo "== CUDA build (compile and link; GPU tests skip without a GPU) =="
  cmake -S . -B build-cuda -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DDRAFTHEAD_CUDA=ON >/dev/null
  cmake --build build-cuda -j"$jobs"
  ctest --test-dir build-cuda --output-on-failure -L cuda
fi
if [ "${DRAFTHEAD_SKIP_FUZZ:-0}" != 1 ]; then
  echo "== fuzz (bounded) =="
  cmake -S . -B build-fuzz -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DDRAFTHEAD_CUDA=OFF \
    -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ -DDRAFTHEAD_FUZZ=ON \
    -DDRAFTHEAD_TESTS=ON -DDRAFTHEAD_BENCH=OFF >/dev/null
  cmake --build build-fuzz -j"$jobs" --target fuzz_safetensors fuzz_lane
  ctest --test-dir build-fuzz --output-on-failure -L fuzz
fi
if [ "${DRAFTHEAD_SKIP_SANITIZE:-0}" != 1 ]; then
  echo "== ASan/UBSan build: unit tests =="
  cmake -S . -B build-asan -G Ninja -DCMAKE_BUILD_TYPE=Debug -DDRAFTHEAD_CUDA=OFF \
    -DDRAFTHEAD_SANITIZE=ON -DDRAFTHEAD_BENCH=OFF >/dev/null
  cmake --build build-asan -j"$jobs"
  ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1 \
    ctest --test-dir build-asan --output-on-failure -j"$jobs" -LE "fuzz|cuda" --timeout 1200
fi
echo "all test stages passed"
