# tests for kernels (fragment of tests/CMakeLists.txt)
