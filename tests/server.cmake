# tests for server (fragment of tests/CMakeLists.txt)
