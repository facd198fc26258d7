# tests for fuzz (fragment of tests/CMakeLists.txt), included with -DDRAFTHEAD_FUZZ=ON and clang:
#   cmake -S . -B build-fuzz -G Ninja -DCMAKE_CXX_COMPILER=clang++ -DCMAKE_C_COMPILER=clang \
#         -DDRAFTHEAD_FUZZ=ON -DDRAFTHEAD_CUDA=OFF
#   cmake --build build-fuzz --target fuzz_safetensors && ctest --test-dir build-fuzz -L fuzz
# The parser is compiled into the target directly so it gets coverage instrumentation.
set(_dh_fuzz_flags -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined
  -fno-omit-frame-pointer)
add_executable(fuzz_safetensors fuzz_safetensors.cc ${PROJECT_SOURCE_DIR}/common/safetensors.cc
  ${PROJECT_SOURCE_DIR}/common/safetensors_writer.cc)
target_compile_options(fuzz_safetensors PRIVATE ${_dh_fuzz_flags})
target_link_options(fuzz_safetensors PRIVATE ${_dh_fuzz_flags})
target_link_libraries(fuzz_safetensors PRIVATE drafthead_options absl::status absl::statusor
  absl::strings nlohmann_json::nlohmann_json)

# libFuzzer writes new inputs into the first corpus directory: a scratch one in the build tree,
# seeded read-only from tests/fuzz_corpus/safetensors.
set(_dh_fuzz_corpus ${CMAKE_CURRENT_BINARY_DIR}/fuzz_safetensors_corpus)
file(MAKE_DIRECTORY ${_dh_fuzz_corpus})
add_test(NAME fuzz_safetensors
  COMMAND fuzz_safetensors -max_total_time=30 -seed=1 -max_len=4096
    -dict=${CMAKE_CURRENT_SOURCE_DIR}/fuzz_safetensors.dict
    ${_dh_fuzz_corpus} ${CMAKE_CURRENT_SOURCE_DIR}/fuzz_corpus/safetensors)
set_tests_properties(fuzz_safetensors PROPERTIES TIMEOUT 120 LABELS fuzz)

# The lane's untrusted inputs (server/lane/lane_descriptor.cc), compiled in for coverage.
add_executable(fuzz_lane fuzz_lane.cc ${PROJECT_SOURCE_DIR}/server/lane/lane_descriptor.cc)
target_compile_options(fuzz_lane PRIVATE ${_dh_fuzz_flags})
target_link_options(fuzz_lane PRIVATE ${_dh_fuzz_flags})
target_link_libraries(fuzz_lane PRIVATE drafthead_options drafthead_proto absl::status absl::statusor absl::strings)
set(_dh_fuzz_lane_corpus ${CMAKE_CURRENT_BINARY_DIR}/fuzz_lane_corpus)
file(MAKE_DIRECTORY ${_dh_fuzz_lane_corpus})
add_test(NAME fuzz_lane COMMAND fuzz_lane -max_total_time=30 -seed=1 -max_len=2048 ${_dh_fuzz_lane_corpus})
set_tests_properties(fuzz_lane PROPERTIES TIMEOUT 120 LABELS fuzz)
