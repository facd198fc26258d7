# tests for kernels (fragment of tests/CMakeLists.txt)

# Float64 reference implementations shared by every area's tests (twin, GEMV, full-vocab
# reductions): include "reference.h", link drafthead_test_reference.
add_library(drafthead_test_reference STATIC reference.cc)
target_link_libraries(drafthead_test_reference PUBLIC drafthead_options)
target_include_directories(drafthead_test_reference PUBLIC ${CMAKE_CURRENT_SOURCE_DIR})
target_compile_options(drafthead_test_reference PRIVATE -O2)

drafthead_add_test(twin_test SOURCES twin_test.cc
  LIBS drafthead_kernels_cpu drafthead_test_reference LABELS kernels TIMEOUT 300)
drafthead_add_test(head_gemv_test SOURCES head_gemv_test.cc
  LIBS drafthead_kernels_cpu drafthead_test_reference LABELS kernels TIMEOUT 600)
drafthead_add_test(shard_reduce_test SOURCES shard_reduce_test.cc
  LIBS drafthead_kernels_cpu drafthead_test_reference LABELS kernels TIMEOUT 300)
