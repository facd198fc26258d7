#!/bin/bash
# deploy/check-cpu-runtime.sh STAGE_DIR [ROOTFS_DIR]: the CPU image's runtime stage without Docker,
# on a clean Debian 12 made by debootstrap (as root; needs debootstrap and the Debian mirror):
# copies what the Dockerfile's `cpu` stage copies, runs deploy/install-runtime.sh in a chroot (the
# derived package list must make every library resolve), then starts a 2-rank CPU group there as
# the image's user (uid 10001) through the staged entrypoint, probes it with the staged health
# check and stops it with SIGTERM (must exit 0). STAGE_DIR comes from
#   deploy/build-cpu.sh build --src=. --build=/tmp/b --stage=STAGE_DIR [--prebuilt=build]
# Not part of ctest (root, mounts, network, ~2 min); run it by hand before publishing an image
# built on a new base.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
stage=${1:?usage: check-cpu-runtime.sh STAGE_DIR [ROOTFS_DIR]}
root=${2:-$(mktemp -d /tmp/drafthead-rootfs.XXXXXX)}
[ "$(id -u)" = 0 ] || { echo "check-cpu-runtime.sh: needs root (debootstrap, chroot, mounts)" >&2; exit 1; }
[ -f "$stage/runtime-packages.txt" ] || { echo "check-cpu-runtime.sh: $stage is not a staged build" >&2; exit 1; }
if [ ! -x "$root/bin/bash" ]; then
  timeout 900 debootstrap --variant=minbase bookworm "$root" http://deb.debian.org/debian >"$root.debootstrap.log" 2>&1 ||
    { tail -20 "$root.debootstrap.log" >&2; exit 1; }
fi
mkdir -p "$root/usr/local/share/drafthead"
cp "$stage"/bin/* "$root/usr/local/bin/"
cp "$stage/runtime-packages.txt" "$root/usr/local/share/drafthead/"
cp "$here/install-runtime.sh" "$root/tmp/"
cp /etc/resolv.conf "$root/etc/resolv.conf"
mount -t proc proc "$root/proc"
mount --bind /dev "$root/dev"
pid=""
cleanup() {
  [ -n "$pid" ] && kill -KILL "$pid" 2>/dev/null || true
  umount "$root/dev" "$root/proc" 2>/dev/null || true
}
trap cleanup EXIT
chroot "$root" bash -c 'id -u drafthead >/dev/null 2>&1 || bash /tmp/install-runtime.sh /usr/local/share/drafthead/runtime-packages.txt /usr/local/bin'
port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
log=$root/tmp/server.log
run() { chroot --userspec=10001:10001 "$root" env -i PATH=/usr/local/bin:/usr/bin:/bin "$@"; }
# Not through run(): a function in the background is a subshell, and $! must be the chroot, which
# execs env, the entrypoint and the server in turn (one pid: SIGTERM reaches the server).
chroot --userspec=10001:10001 "$root" env -i PATH=/usr/local/bin:/usr/bin:/bin DRAFTHEAD_TP=2 DRAFTHEAD_SYNTHETIC=1 DRAFTHEAD_LISTEN=0.0.0.0:$port DRAFTHEAD_DRAIN_GRACE=1s \
  "DRAFTHEAD_EXTRA_ARGS=--hidden-size=256 --padded-vocab=4096 --threads=1" \
  /usr/local/bin/drafthead-entrypoint >"$log" 2>&1 &
pid=$!
if ! run DRAFTHEAD_LISTEN=0.0.0.0:$port DRAFTHEAD_HEALTH_WAIT=60s /usr/local/bin/drafthead-healthcheck; then
  tail -20 "$log" >&2
  echo "check-cpu-runtime.sh: the group did not become SERVING" >&2
  exit 1
fi
kill -TERM "$pid"
timeout 30 tail --pid="$pid" -f /dev/null || true
rc=0
wait "$pid" || rc=$?
pid=""
[ "$rc" = 0 ] || { tail -20 "$log" >&2; echo "check-cpu-runtime.sh: exit status $rc after SIGTERM" >&2; exit 1; }
echo "check-cpu-runtime.sh: clean Debian 12 + $(wc -l <"$stage/runtime-packages.txt") runtime packages: served as uid 10001, drained, exit 0"
