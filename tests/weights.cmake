# tests for weights (fragment of tests/CMakeLists.txt)
