# tests for cuda (fragment of tests/CMakeLists.txt)
