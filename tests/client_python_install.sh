#!/bin/bash
# client_python_install.sh PYTHON PKG_DIR: installs the built wheel (PKG_DIR/dist) into a fresh
# venv PKG_DIR/venv as a user would: `python3 -m venv --system-site-packages` (Debian's grpcio,
# protobuf and numpy satisfy the wheel's declared dependencies; no index is reachable), then
# `pip install` of the wheel. The Python tests run that venv's python (ctest fixture python_venv).
set -euo pipefail
py=$1
dir=$(cd "$2" && pwd)
shopt -s nullglob
wheels=("$dir"/dist/drafthead_client-*.whl)
[ ${#wheels[@]} -eq 1 ] || { echo "want one wheel in $dir/dist, found: ${wheels[*]:-none}"; exit 1; }
rm -rf "$dir/venv"
"$py" -m venv --system-site-packages "$dir/venv"
env -u PYTHONPATH "$dir/venv/bin/python" -m pip install --quiet --disable-pip-version-check --root-user-action=ignore --no-index "${wheels[0]}"
# Imported from the venv, not from a source tree: run from / with no PYTHONPATH.
cd / && env -u PYTHONPATH "$dir/venv/bin/python" -c '
import sys, drafthead_client as dc
assert dc.__file__.startswith(sys.prefix), dc.__file__
print("installed", dc.__version__, "at", dc.__file__)'
