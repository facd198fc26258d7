# tests for cuda (fragment of tests/CMakeLists.txt, included only in CUDA builds). Every test skips
# with a message where no GPU is present; on a GPU they check the kernels against the CPU kernels
# and float64 references, the CUDA backend end to end, and the NCCL collective.
drafthead_add_test(cuda_kernels_test SOURCES cuda_kernels_test.cc
  LIBS drafthead_kernels_cuda_experimental drafthead_kernels_cpu CUDA::cudart CUDA::cublas LABELS cuda)
drafthead_add_test(cuda_backend_test SOURCES cuda_backend_test.cc
  LIBS drafthead_engine CUDA::cudart LABELS cuda)
target_include_directories(cuda_backend_test PRIVATE ${DRAFTHEAD_NCCL_INCLUDE})
