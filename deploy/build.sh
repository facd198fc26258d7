#!/bin/bash
# deploy/build.sh: the build steps of the container images, as one script, so that the Dockerfile
# (which only calls it) and the test that runs it outside Docker (tests/deploy_build_test.sh)
# cannot drift apart.
#
#   build.sh deps [--cuda] [--print]
#       apt-get installs what the build needs (the project's Debian 12 package names, which
#       Ubuntu 24.04 shares); --cuda adds NCCL's headers; --print only lists the packages.
#   build.sh build --src=DIR --build=DIR --stage=DIR [--cuda=ON|OFF] [--cuda-archs=LIST]
#                  [--jobs=N] [--prebuilt=BINARY_DIR] [--no-smoke]
#       configures (tests and benchmarks off), compiles drafthead-server, drafthead-client and
#       drafthead-quantize, and stages what the runtime image copies:
#         STAGE/bin/          the three programs (debug info stripped) + drafthead-entrypoint
#                             and drafthead-healthcheck
#         STAGE/runtime-packages.txt   the Debian/Ubuntu packages owning every shared library
#                             the programs load (from ldd + dpkg -S): the runtime stage installs
#                             exactly these, runtime packages, never -dev ones
#       then smoke-tests the staged programs: a 2-rank CPU group with tiny synthetic weights on
#       loopback started through the staged entrypoint, probed by the staged health check, and
#       stopped with SIGTERM (must exit 0). The CUDA build runs the same smoke on its CPU backend
#       (no GPU at build time).
#       --prebuilt=DIR takes the programs from an existing build tree (DIR/server, DIR/client)
#       instead of compiling: the CI test uses it to stay fast, still running the configure,
#       stage, dependency and smoke steps for real.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
die() {
  echo "build.sh: error: $*" >&2
  exit 1
}

# What CMakeLists.txt finds (absl, Protobuf, gRPC, Gloo, nlohmann_json, cpp-httplib, OpenSSL,
# zlib) and builds with. A subset of scripts/setup-deps.sh (tests/deploy_build_test.sh checks):
# the image needs neither the test frameworks nor clang nor Prometheus.
build_deps=(build-essential cmake ninja-build pkg-config
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler libabsl-dev
  libgloo-dev nlohmann-json3-dev libcpp-httplib-dev libssl-dev zlib1g-dev)
# NCCL comes from NVIDIA's apt repository, which the nvidia/cuda images have configured (the
# devel image already carries it; naming it keeps the build honest on other CUDA bases).
cuda_deps=(libnccl-dev)

cmd=${1:-}
shift || true
case "$cmd" in
  deps)
    cuda=0 print=0
    for a in "$@"; do
      case "$a" in
        --cuda) cuda=1 ;;
        --print) print=1 ;;
        *) die "deps: unknown argument $a" ;;
      esac
    done
    pkgs=("${build_deps[@]}")
    ((cuda)) && pkgs+=("${cuda_deps[@]}")
    if ((print)); then
      printf '%s\n' "${pkgs[@]}"
      exit 0
    fi
    # Only what is missing: the nvidia/cuda images hold (apt-mark hold) their NCCL and CUDA
    # packages, and naming a held package whose candidate is newer makes apt-get fail.
    missing=()
    for p in "${pkgs[@]}"; do
      dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
    done
    if ((${#missing[@]})); then
      export DEBIAN_FRONTEND=noninteractive
      apt-get update -qq
      apt-get install -y -qq --no-install-recommends "${missing[@]}"
      rm -rf /var/lib/apt/lists/*
    fi
    ;;
  build)
    src="" build="" stage="" cuda=OFF archs=90a jobs=$(nproc) prebuilt="" smoke=1
    for a in "$@"; do
      case "$a" in
        --src=*) src=${a#*=} ;;
        --build=*) build=${a#*=} ;;
        --stage=*) stage=${a#*=} ;;
        --cuda=ON | --cuda=OFF) cuda=${a#*=} ;;
        --cuda-archs=*) archs=${a#*=} ;;
        --jobs=*) jobs=${a#*=} ;;
        --prebuilt=*) prebuilt=${a#*=} ;;
        --no-smoke) smoke=0 ;;
        *) die "build: unknown argument $a" ;;
      esac
    done
    [ -n "$src" ] && [ -n "$build" ] && [ -n "$stage" ] || die "build needs --src, --build and --stage"
    [ -f "$src/CMakeLists.txt" ] || die "--src=$src has no CMakeLists.txt"
    archs_re='^[0-9a-z;,-]+$'
    [[ $archs =~ $archs_re ]] || die "--cuda-archs='$archs' is not a CUDA architecture list (e.g. 90a or 90a;100a)"
    archs=${archs//,/;}

    echo "== configure (CUDA $cuda, architectures $archs) =="
    cmake -S "$src" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
      -DDRAFTHEAD_CUDA="$cuda" -DDRAFTHEAD_CUDA_ARCHITECTURES="$archs" \
      -DDRAFTHEAD_TESTS=OFF -DDRAFTHEAD_BENCH=OFF
    if [ -n "$prebuilt" ]; then
      bindir=$prebuilt
      echo "== compile: skipped, taking the programs from $bindir =="
    else
      echo "== compile =="
      cmake --build "$build" -j"$jobs" --target drafthead-server drafthead-client drafthead-quantize
      bindir=$build
    fi

    echo "== stage into $stage =="
    rm -rf "$stage"
    mkdir -p "$stage/bin"
    for p in server/drafthead-server client/drafthead-client tools/drafthead-quantize; do
      [ -x "$bindir/$p" ] || die "$bindir/$p was not built"
      install -m 0755 "$bindir/$p" "$stage/bin/"
      # Keep the symbol table (readable backtraces from a crashed rank), drop DWARF (most of the size).
      strip --strip-debug "$stage/bin/$(basename "$p")"
    done
    install -m 0755 "$here/entrypoint.sh" "$stage/bin/drafthead-entrypoint"
    install -m 0755 "$here/healthcheck.sh" "$stage/bin/drafthead-healthcheck"
    bash "$here/runtime-deps.sh" "$stage"/bin/drafthead-server "$stage"/bin/drafthead-client \
      "$stage"/bin/drafthead-quantize >"$stage/runtime-packages.txt"
    echo "runtime packages: $(tr '\n' ' ' <"$stage/runtime-packages.txt")"

    if ((smoke)); then
      echo "== smoke: 2 CPU ranks, synthetic 256 x 4096 head, loopback =="
      log=$(mktemp)
      DRAFTHEAD_BIN="$stage/bin/drafthead-server" DRAFTHEAD_SYNTHETIC=1 DRAFTHEAD_TP=2 \
        DRAFTHEAD_BACKEND=cpu DRAFTHEAD_COMM=gloo DRAFTHEAD_LISTEN=127.0.0.1:0 \
        DRAFTHEAD_EXTRA_ARGS="--hidden-size=256 --padded-vocab=4096 --threads=1" \
        "$stage/bin/drafthead-entrypoint" 2>"$log" &
      pid=$!
      port=""
      for _ in $(seq 1 300); do  # the port is logged as soon as gRPC listens: at most 30 s
        port=$(sed -n 's/.*event=grpc_listening.* port=\([0-9]*\).*/\1/p' "$log" | head -1)
        [ -n "$port" ] && break
        kill -0 "$pid" 2>/dev/null || break
        sleep 0.1
      done
      ok=0
      # Probe for up to 60 s; give up at once if a rank fails or the server exits.
      for _ in $(seq 1 60); do
        [ -n "$port" ] || break
        if DRAFTHEAD_HEALTH_TARGET=127.0.0.1:$port DRAFTHEAD_HEALTH_WAIT=1s \
          DRAFTHEAD_CLIENT="$stage/bin/drafthead-client" "$stage/bin/drafthead-healthcheck" 2>/dev/null; then
          ok=1
          break
        fi
        grep -qE 'event=(rank_exited|start_failed|join_failed)' "$log" && break
        kill -0 "$pid" 2>/dev/null || break
      done
      kill -TERM "$pid" 2>/dev/null || true
      rc=0
      timeout 30 tail --pid="$pid" -f /dev/null || { kill -KILL "$pid" 2>/dev/null || true; }
      wait "$pid" || rc=$?
      if ((!ok)) || ((rc != 0)); then
        cat "$log" >&2
        rm -f "$log"
        die "smoke test failed (serving: $ok, exit status after SIGTERM: $rc)"
      fi
      rm -f "$log"
      echo "smoke: served on port $port, health SERVING, drained and exited 0 on SIGTERM"
    fi
    ;;
  *)
    die "usage: build.sh deps [--cuda] [--print] | build.sh build --src=DIR --build=DIR --stage=DIR [...]"
    ;;
esac
