#!/bin/bash
# deploy/install-runtime.sh PACKAGE_LIST BIN_DIR: the runtime stages' one RUN step (both the CUDA
# and the CPU image): installs the runtime packages that deploy/runtime-deps.sh listed in the
# builder, creates the unprivileged user the server runs as, and proves that every shared library
# of the programs now resolves (a missing one fails the image build, not the first pod start).
# DRAFTHEAD_INSTALL_DRY_RUN=1 only prints what it would install (tests/deploy_build_test.sh).
set -euo pipefail
list=$1 bindir=$2
# Only the packages the base image lacks: the nvidia/cuda runtime image already has (and holds,
# apt-mark hold) libnccl2 and the CUDA libraries; naming a held package can make apt-get fail.
missing=()
while read -r p; do
  [ -n "$p" ] || continue
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done <"$list"
if [ "${DRAFTHEAD_INSTALL_DRY_RUN:-0}" = 1 ]; then  # tests: what would be installed, nothing changed
  printf 'would install: %s\n' "${missing[@]}"
  exit 0
fi
if ((${#missing[@]})); then
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  # --no-install-recommends: the list is complete (ldd is transitive); recommends would add tools.
  apt-get install -y -qq --no-install-recommends "${missing[@]}"
  apt-get clean
  rm -rf /var/lib/apt/lists/*
fi
# A fixed uid/gid (10001) so that volume permissions and Kubernetes' runAsUser/fsGroup can name it;
# no home and no shell, and not root: the server needs no privilege (ports above 1024, GPUs
# through the device nodes the runtime grants).
groupadd --system --gid 10001 drafthead
useradd --system --uid 10001 --gid 10001 --no-create-home --home-dir /nonexistent \
  --shell /usr/sbin/nologin drafthead
missing=$(for b in "$bindir"/drafthead-server "$bindir"/drafthead-client "$bindir"/drafthead-quantize; do
  ldd "$b" | grep 'not found' | grep -vE 'libcuda\.so|libnvidia-ml\.so' || true; done)
if [ -n "$missing" ]; then
  echo "install-runtime.sh: unresolved libraries:" >&2
  echo "$missing" >&2
  exit 1
fi
