#!/bin/bash
# Installs the Debian packages drafthead builds and tests with (idempotent; as root, or via sudo).
set -euo pipefail
pkgs=(build-essential cmake ninja-build pkg-config git
      libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler libabsl-dev
      libgloo-dev nlohmann-json3-dev libgtest-dev libgmock-dev libbenchmark-dev libcpp-httplib-dev
      libssl-dev zlib1g-dev clang libclang-rt-dev prometheus openssl
      python3 python3-grpcio python3-protobuf python3-numpy python3-yaml
      python3-pip python3-setuptools python3-wheel python3-venv mypy)  # the Python client's wheel, venv tests, types
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then exit 0; fi
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO=sudo
echo "installing: ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
