#!/bin/bash
# tests/deploy_build_test.sh: the CPU image's build steps, outside Docker. Runs
# `deploy/build-cpu.sh build` exactly as the Dockerfile's cpu-builder stage does, into a temp
# dir, but with --prebuilt=$DRAFTHEAD_BIN_DIR so CI does not compile everything a second time:
# the configure step (the image's CMake options) runs for real, then staging, the runtime-package
# derivation (ldd + dpkg) and the smoke start of the staged programs through the staged entrypoint
# and health check. Also checks that the image's build-dependency list is a subset of the project's
# scripts/setup-deps.sh and that install-runtime.sh would install no -dev package.
set -uo pipefail
src=${DRAFTHEAD_SOURCE_DIR:?}
bindir=${DRAFTHEAD_BIN_DIR:?}
work=$(mktemp -d /tmp/drafthead-build-test.XXXXXX)
trap 'rm -rf "$work"' EXIT
passed=0 failed=0
pass() { echo "PASS: $*"; passed=$((passed + 1)); }
fail() { echo "FAIL: $*"; failed=$((failed + 1)); }

if timeout 400 bash "$src/deploy/build-cpu.sh" build --src="$src" --build="$work/build" --stage="$work/stage" \
  --prebuilt="$bindir" >"$work/out.log" 2>&1; then
  pass "deploy/build-cpu.sh build (configure, stage, runtime packages, smoke)"
else
  fail "deploy/build-cpu.sh build failed:"
  tail -40 "$work/out.log"
fi
grep -q '^smoke: served on port' "$work/out.log" && pass "smoke: the staged server served and drained" || fail "no smoke line"
for p in drafthead-server drafthead-client drafthead-quantize drafthead-entrypoint drafthead-healthcheck; do
  [ -x "$work/stage/bin/$p" ] && pass "staged $p" || fail "missing stage/bin/$p"
done
grep -q 'DRAFTHEAD_TESTS:BOOL=OFF' "$work/build/CMakeCache.txt" && grep -q 'DRAFTHEAD_CUDA:STRING=OFF' "$work/build/CMakeCache.txt" &&
  pass "configured with the image's options (tests off, CUDA off)" || fail "CMake cache lacks the image's options"
pk=$work/stage/runtime-packages.txt
if [ -s "$pk" ]; then
  grep -q '^libgrpc++' "$pk" && grep -q '^libprotobuf' "$pk" && grep -q '^libgloo' "$pk" &&
    pass "runtime packages include gRPC, Protobuf, Gloo: $(tr '\n' ' ' <"$pk")" || fail "runtime packages: $(cat "$pk")"
  grep -q -- '-dev$' "$pk" && fail "a -dev package in the runtime list" || pass "no -dev package at run time"
  # Every listed package is a real, installed package here (names as the runtime stage installs them).
  bad=$(while read -r p; do dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || echo "$p"; done <"$pk")
  [ -z "$bad" ] && pass "every runtime package is an installed package name" || fail "unknown packages: $bad"
else
  fail "no runtime-packages.txt"
fi
# install-runtime.sh, dry run: on this machine (which built the programs) nothing is missing.
out=$(printf 'libc6\nno-such-package-xyz\n' >"$work/pk2"; DRAFTHEAD_INSTALL_DRY_RUN=1 bash "$src/deploy/install-runtime.sh" "$work/pk2" "$work/stage/bin" 2>&1)
[ "$out" = "would install: no-such-package-xyz" ] && pass "install-runtime.sh installs only the missing packages" || fail "install-runtime dry run: $out"
# The image's build dependencies use the project's package names (scripts/setup-deps.sh).
project=$(sed -n '/^pkgs=(/,/)/p' "$src/scripts/setup-deps.sh" | tr -d '()' | sed 's/pkgs=//' | tr -s ' \n' '\n')
missing=$(bash "$src/deploy/build-cpu.sh" deps --print | while read -r p; do grep -qx -- "$p" <<<"$project" || echo "$p"; done)
[ -z "$missing" ] && pass "image build deps are a subset of scripts/setup-deps.sh" || fail "build deps not in setup-deps.sh: $missing"
bash "$src/deploy/build.sh" deps --cuda --print | grep -qx libnccl-dev && pass "CUDA build deps add NCCL" || fail "no libnccl-dev in CUDA deps"
# Argument checking of the script itself.
out=$(bash "$src/deploy/build.sh" build --src="$src" --build="$work/b2" --stage="$work/s2" --cuda-archs='90a;$(id)' 2>&1)
[[ $out == *"is not a CUDA architecture list"* ]] && pass "a bad --cuda-archs is refused" || fail "cuda-archs check: $out"
for f in "$src"/deploy/*.sh; do bash -n "$f" && pass "bash -n $(basename "$f")" || fail "syntax: $f"; done
echo "$passed passed, $failed failed"
[ "$failed" = 0 ]
