#!/usr/bin/env bash
# Builds Triton's C++ client library (gRPC and HTTP) and perf_analyzer from their public sources
# against Debian's packages, for the interoperability runs in docs/client.md ("KServe v2 / Triton").
# Not part of CI: it needs the sources, which this repository never vendors.
#
# Their own CMake cannot be used here: perf_analyzer's and the client's CMakeLists need CMake
# >= 3.31.8 (Debian 12 has 3.25) and download gRPC, protobuf, googletest and libb64 at configure
# time. So this compiles the same sources directly with g++ against Debian's libraries.
#
#   apt-get install libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev rapidjson-dev \
#       libcurl4-openssl-dev libb64-dev zlib1g-dev
#   tests/interop/build_triton_clients.sh SRC OUT
#
# SRC holds one git repository (or bare mirror) each of triton-inference-server's client, common
# and perf_analyzer, named client/, common/, perf_analyzer/ (or owner+name/repo as a mirror tool
# lays them out). OUT receives the sources (git archive of HEAD), objects, and
#   OUT/bin/perf_analyzer, OUT/lib/libgrpcclient_static.a, OUT/lib/libhttpclient_static.a,
#   OUT/bin/triton_grpc_check (tests/interop/triton_grpc_check.cc against the client library).
# JOBS (default 2) compiles in parallel.
set -euo pipefail
SRC=${1:?SRC}
OUT=${2:?OUT}
JOBS=${JOBS:-2}
HERE=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$OUT"/{src,gen,obj,lib,bin}
OUT=$(cd "$OUT" && pwd)

repo_dir() {  # name -> git dir
  for d in "$SRC/$1" "$SRC/triton-inference-server+$1/repo"; do
    [[ -d "$d" ]] && { echo "$d"; return; }
  done
  echo "no $1 under $SRC" >&2; exit 1
}
# Only the paths used (a mirror may lack large files elsewhere in the tree; git archive then still
# prints "invalid object" for them, exits 0 and writes the paths asked for).
declare -A paths=([client]="src/c++/library src/python/library" [common]="protobuf include" [perf_analyzer]="src")
for name in client common perf_analyzer; do
  if [[ ! -d "$OUT/src/$name" ]]; then
    git_dir=$(git -C "$(repo_dir "$name")" rev-parse --absolute-git-dir)
    mkdir -p "$OUT/src/$name"
    # shellcheck disable=SC2086
    git --git-dir="$git_dir" archive HEAD ${paths[$name]} | tar -x -C "$OUT/src/$name"
    git --git-dir="$git_dir" rev-parse HEAD > "$OUT/src/$name.commit"
  fi
done
LIB=$OUT/src/client/src/c++/library
PA=$OUT/src/perf_analyzer/src
COMMON=$OUT/src/common

# Stubs from Triton's own protocol files, with Debian's protoc and gRPC plugin.
[[ -f "$OUT/gen/health.grpc.pb.cc" ]] || protoc -I "$COMMON/protobuf" --cpp_out="$OUT/gen" --grpc_out="$OUT/gen" \
  --plugin=protoc-gen-grpc="$(command -v grpc_cpp_plugin)" \
  "$COMMON/protobuf/grpc_service.proto" "$COMMON/protobuf/model_config.proto" "$COMMON/protobuf/health.proto"

# tritonclient (Python) from the same sources: its package plus stubs from Triton's .proto files
# (tritonclient imports them as tritonclient.grpc.service_pb2 / model_config_pb2). Needs Debian's
# python3-grpcio, python3-protobuf, python3-numpy, python3-rapidjson and grpc_python_plugin.
#   PYTHONPATH=OUT/python python3 tests/interop/tritonclient_check.py
PY=$OUT/python
if [[ ! -f "$PY/tritonclient/grpc/service_pb2.py" ]]; then
  mkdir -p "$PY"
  cp -r "$OUT/src/client/src/python/library/tritonclient" "$PY/"
  cp "$COMMON/protobuf/grpc_service.proto" "$OUT/gen/service.proto"
  protoc -I "$OUT/gen" -I "$COMMON/protobuf" --python_out="$PY/tritonclient/grpc" --grpc_python_out="$PY/tritonclient/grpc" \
    --plugin=protoc-gen-grpc_python="$(command -v grpc_python_plugin)" "$OUT/gen/service.proto" "$COMMON/protobuf/model_config.proto"
  # The generated modules import each other by top-level name; make that relative to the package.
  sed -i 's/^import model_config_pb2/from tritonclient.grpc import model_config_pb2/; s/^import service_pb2/from tritonclient.grpc import service_pb2/' \
    "$PY/tritonclient/grpc/"*_pb2*.py
fi

CXXFLAGS=(-std=c++20 -O2 -g0 -fPIC -DTRITON_ENABLE_ZLIB=1 -DDOCTEST_CONFIG_DISABLE
          -DPERF_ANALYZER_VERSION=source -DGIT_SHA="$(cut -c1-8 "$OUT/src/perf_analyzer.commit")"
          -I"$OUT/gen" -I"$LIB" -I"$COMMON/include" -I"$PA" -I"$PA/session_concurrency" -I"$PA/client_backend")

compile() {  # src obj
  [[ "$2" -nt "$1" ]] && return 0
  mkdir -p "$(dirname "$2")"
  echo "  c++ ${1#$OUT/src/}"
  g++ "${CXXFLAGS[@]}" -c "$1" -o "$2"
}
export -f compile
export OUT CXXFLAGS_STR="${CXXFLAGS[*]}"

sources=()
for f in grpc_service.pb.cc grpc_service.grpc.pb.cc model_config.pb.cc health.pb.cc health.grpc.pb.cc; do
  sources+=("$OUT/gen/$f")
done
for f in common.cc grpc_client.cc http_client.cc shm_utils.cc json_utils.cc cencode.cc; do
  sources+=("$LIB/$f")
done
pa_sources=(main.cc command_line_parser.cc perf_analyzer.cc model_parser.cc perf_utils.cc load_manager.cc
  data_loader.cc concurrency_manager.cc request_rate_manager.cc custom_request_schedule_manager.cc
  load_worker.cc concurrency_worker.cc request_rate_worker.cc custom_load_manager.cc infer_context.cc
  inference_profiler.cc report_writer.cc mpi_utils.cc metrics_manager.cc infer_data_manager_base.cc
  infer_data_manager.cc infer_data_manager_shm.cc sequence_manager.cc profile_data_collector.cc
  profile_data_exporter.cc periodic_concurrency_manager.cc periodic_concurrency_worker.cc
  session_concurrency/payload_dataset_manager.cc session_concurrency/payload_json_utils.cc
  session_concurrency/request_handler.cc session_concurrency/response_json_utils.cc
  session_concurrency/session_concurrency_manager.cc client_backend/client_backend.cc
  client_backend/triton/triton_client_backend.cc)
for f in "${pa_sources[@]}"; do sources+=("$PA/$f"); done
sources+=("$HERE/triton_grpc_check.cc")

obj_of() { local s=${1#$OUT/}; s=${s#$HERE/}; echo "$OUT/obj/${s%.*}.o"; }
printf '%s\n' "${sources[@]}" | while read -r s; do echo "$s $(obj_of "$s")"; done |
  xargs -P "$JOBS" -n 2 bash -c 'CXXFLAGS=($CXXFLAGS_STR); compile "$0" "$1"'

lib_objs=()
for s in "${sources[@]:0:11}"; do lib_objs+=("$(obj_of "$s")"); done
rm -f "$OUT/lib/libgrpcclient_static.a" "$OUT/lib/libhttpclient_static.a"
ar rcs "$OUT/lib/libgrpcclient_static.a" "${lib_objs[@]:0:5}" "$(obj_of "$LIB/common.cc")" "$(obj_of "$LIB/grpc_client.cc")" \
  "$(obj_of "$LIB/shm_utils.cc")"
ar rcs "$OUT/lib/libhttpclient_static.a" "$(obj_of "$LIB/http_client.cc")" "$(obj_of "$LIB/json_utils.cc")" \
  "$(obj_of "$LIB/cencode.cc")"
LIBS=(-L"$OUT/lib" -lhttpclient_static -lgrpcclient_static -lgrpc++ -lgrpc -lgpr -lprotobuf -lcurl -lz -lb64
      -labsl_synchronization -lpthread -ldl -lrt)
pa_objs=()
for f in "${pa_sources[@]}"; do pa_objs+=("$(obj_of "$PA/$f")"); done
g++ -o "$OUT/bin/perf_analyzer" "${pa_objs[@]}" "${LIBS[@]}"
g++ -o "$OUT/bin/triton_grpc_check" "$(obj_of "$HERE/triton_grpc_check.cc")" "${LIBS[@]}"
echo "built: $OUT/bin/perf_analyzer $OUT/bin/triton_grpc_check"
