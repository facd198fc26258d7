#!/bin/bash
# build-wheel.sh PYTHON GEN_DIR WORK_DIR VERSION [LANE_SO [GRPC_SO]]: the Python client's wheel, offline.
# Stages client/python with the generated stubs (GEN_DIR/drafthead_client/_gen), the version and,
# when LANE_SO / GRPC_SO exist, the same-host lane's library and the native unary call's, then
# builds with PYTHON's own pip, setuptools and wheel (Debian's; no build isolation, no index). The
# wheel lands in WORK_DIR/dist: tagged py3-none-any, or py3-none-linux_x86_64 when it carries a
# library. CMake's drafthead_python_wheel target runs this; run that target, not this script.
set -euo pipefail
py=$1 gen=$2 work=$3 version=$4 lane=${5:-} native=${6:-}
src=$(cd "$(dirname "$0")/../client/python" && pwd)
stage=$work/pkg
rm -rf "$stage" "$work/dist"
mkdir -p "$stage"
cp "$src/pyproject.toml" "$stage/"
tar -C "$src" --exclude=__pycache__ -cf - drafthead_client | tar -C "$stage" -xf -
pkg=$stage/drafthead_client
cp -r "$gen/drafthead_client/_gen" "$pkg/"
find "$pkg/_gen" -type d -exec touch {}/__init__.py \;
echo "__version__ = \"$version\"" >"$pkg/_version.py"
for so in "$lane" "$native"; do
  if [ -n "$so" ] && [ -f "$so" ]; then
    mkdir -p "$pkg/_native"
    cp "$so" "$pkg/_native/"
  fi
done
if [ -d "$pkg/_native" ]; then
  # Still pure Python (the libraries are loaded with ctypes), but only for this platform.
  printf '[bdist_wheel]\npython_tag = py3\nplat_name = linux_x86_64\n' >"$stage/setup.cfg"
fi
"$py" -m pip wheel --quiet --disable-pip-version-check --no-build-isolation --no-deps --no-index \
  -w "$work/dist" "$stage"
ls "$work/dist"/drafthead_client-"$version"-*.whl
