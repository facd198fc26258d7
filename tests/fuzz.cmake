# tests for fuzz (fragment of tests/CMakeLists.txt)
