# tests for client (fragment of tests/CMakeLists.txt)
