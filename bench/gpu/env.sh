# On the GPU machine, from the repository root: `source bench/gpu/env.sh`. Unpacks
# $DH_BUNDLE (default bundle-gpu/drafthead-gpu.tar.xz, made by bench/gpu/bundle.sh) into $DH (default /tmp/dh) once and
# puts its programs, libraries and the Python package (drafthead_client, with its stubs) on the paths.
DH=${DH:-/tmp/dh}
DH_BUNDLE=${DH_BUNDLE:-bundle-gpu/drafthead-gpu.tar.xz}
# Unpacked again whenever the bundle differs from the one unpacked (a warm machine keeps /tmp/dh
# between calls, and a later call may carry a new bundle).
dh_stamp=$(stat -c '%s-%Y' "$DH_BUNDLE")
if [ ! -x "$DH/bin/server/drafthead-server" ] || [ "$(cat "$DH/.bundle-stamp" 2>/dev/null)" != "$dh_stamp" ]; then
  rm -rf "$DH" && mkdir -p "$DH" && tar -C "$DH" -xJf "$DH_BUNDLE" && echo "$dh_stamp" >"$DH/.bundle-stamp"
fi
DH_COMMIT=$(cat "$DH/COMMIT" 2>/dev/null || echo unknown)  # the commit the bundle was built from
export DH DH_COMMIT DRAFTHEAD_BIN_DIR="$DH/bin"
export PATH="$DH/bin/server:$DH/bin/client:$DH/bin/bench:$DH/bin/tools:$DH/bin/tests:$PATH"
export LD_LIBRARY_PATH="$DH/lib:/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export PYTHONPATH="$DH/python:$PWD/client/python${PYTHONPATH:+:$PYTHONPATH}"
