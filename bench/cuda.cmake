# CUDA benchmark programs (fragment of bench/CMakeLists.txt, CUDA builds only).
add_executable(drafthead-bench-cuda cuda_head_bench.cu)
target_link_libraries(drafthead-bench-cuda PRIVATE drafthead_kernels_cuda_experimental CUDA::cudart CUDA::cublas)
target_compile_options(drafthead-bench-cuda PRIVATE $<$<COMPILE_LANGUAGE:CUDA>:-O3 --expt-relaxed-constexpr>)
set_target_properties(drafthead-bench-cuda PROPERTIES CUDA_STANDARD 17 CUDA_STANDARD_REQUIRED ON)
add_executable(drafthead-bench-step cuda_step_bench.cc)
target_link_libraries(drafthead-bench-step PRIVATE drafthead_backends CUDA::cudart)
