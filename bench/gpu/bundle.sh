#!/bin/bash
# Builds the CUDA tree here and packs what a GPU machine needs into bundle-gpu/drafthead-gpu.tar.xz
# (ignored by git; name `bundle-gpu` in the device tool's `carry`). On the GPU machine,
# `source bench/gpu/env.sh` unpacks it and sets PATH / LD_LIBRARY_PATH / PYTHONPATH.
#
#   bench/gpu/bundle.sh [TARGET...]   # default: every program, test and benchmark
#   DRAFTHEAD_GPU_BUILD=DIR (build folder), DRAFTHEAD_GPU_BUNDLE=DIR (output folder) override;
#   DRAFTHEAD_SHARED=DIR the shared/ folder (default ../shared beside the checkout; a worktree sets it).
#
# Binaries are stripped; their non-system libraries come from ../shared/tools/bundle-libs.sh.
# The xz tarball keeps the travelling tree far under the device tool's 64 MiB.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
build=${DRAFTHEAD_GPU_BUILD:-$root/build-cuda}
out=${DRAFTHEAD_GPU_BUNDLE:-$root/bundle-gpu}  # must lie in the checkout the device tool sends
export CCACHE_DIR=${CCACHE_DIR:-/work/.ccache}
launcher=()
command -v ccache >/dev/null && launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_C_COMPILER_LAUNCHER=ccache
                                          -DCMAKE_CUDA_COMPILER_LAUNCHER=ccache)
cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DDRAFTHEAD_CUDA=ON \
  -DCMAKE_CUDA_ARCHITECTURES=90a "${launcher[@]}" >/dev/null
if (($#)); then cmake --build "$build" -j"$(nproc)" --target "$@"; else cmake --build "$build" -j"$(nproc)"; fi

stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
mkdir -p "$stage/bin" "$stage/lib" "$stage/python"
mapfile -t bins < <(find "$build" -type f -executable -not -path '*/CMakeFiles/*' -not -name '*.so*' \
                      -exec sh -c 'head -c4 "$1" | grep -q ELF' _ {} \; -print)
# Kept at their build-relative paths (bin/server/drafthead-server, ...): the tests find programs
# through DRAFTHEAD_BIN_DIR=$DH/bin as they do in the build folder.
for b in "${bins[@]}"; do
  rel=${b#"$build"/}
  mkdir -p "$stage/bin/$(dirname "$rel")"
  cp "$b" "$stage/bin/$rel"
  strip --strip-unneeded "$stage/bin/$rel"
done
bash "${DRAFTHEAD_SHARED:-$root/../shared}/tools/bundle-libs.sh" "$stage/lib" "${bins[@]}" >/dev/null
strip --strip-unneeded "$stage"/lib/* 2>/dev/null || true
# The staged Python package, stubs (and the lane's library) in it: the GPU machine has grpcio and
# protobuf, not protoc. env.sh puts it on PYTHONPATH ahead of the source tree's copy.
[ -d "$build/client/python/pkg/drafthead_client" ] && cp -r "$build/client/python/pkg/drafthead_client" "$stage/python/"
mkdir -p "$out"
# The lane's C ABI library (a .so, so not among the programs above), for the Python client: the
# staged package above carries it too (drafthead_client/_native); lane.sh points DRAFTHEAD_LANE_LIB here.
[ -f "$build/client/libdrafthead_lane.so" ] && cp "$build/client/libdrafthead_lane.so" "$stage/lib/"
# The in-process original (../shared/seed, never committed), for the lane-vs-original table.
seed_dir="${DRAFTHEAD_SHARED:-$root/../shared}/seed"
[ -d "$seed_dir" ] && mkdir -p "$out/seed" && cp "$seed_dir"/* "$out/seed/"
# What the bundle was built from (the tables print it: a warm device machine's checkout or build
# folder may be older than the bundle that runs).
echo "$(git -C "$root" rev-parse --short HEAD)$(git -C "$root" diff --quiet HEAD || echo -dirty)" \
  >"$stage/COMMIT"
# Written beside and renamed into place: a device call that copies the tree meanwhile sees the old
# bundle or the new one, never half of one.
tar -C "$stage" -cJf "$out/.drafthead-gpu.tar.xz.part" .
mv -f "$out/.drafthead-gpu.tar.xz.part" "$out/drafthead-gpu.tar.xz"
echo "bundle: $(du -h "$out/drafthead-gpu.tar.xz" | cut -f1) in $out/drafthead-gpu.tar.xz (${#bins[@]} programs)"
