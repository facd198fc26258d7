# tests for the KServe v2 API (fragment of tests/CMakeLists.txt): the translation unit-tested, then
# Triton's `timeout` parameter against a stopped queue in process (kserve_queue_test), then
# the real server from two independent clients: Node's @grpc/grpc-js (installed from npm into the
# build tree on first use; skipped only if that fails) and Python's grpcio, each reading
# proto/inference/grpc_service.proto. Each starts its own server (CPU, tp=2, tiny shapes).
# kserve_client_habits_test replays the wire habits of perf_analyzer / Triton's C++ client, the
# KServe SDK and tritonclient (issue 20) from grpcio against a tp=3 server.
drafthead_add_test(kserve_translate_test SOURCES kserve_translate_test.cc LIBS drafthead_api TIMEOUT 60)
drafthead_add_test(kserve_queue_test SOURCES kserve_queue_test.cc LIBS drafthead_api drafthead_test_reference TIMEOUT 120)

add_test(NAME kserve_node_test COMMAND ${CMAKE_CURRENT_SOURCE_DIR}/kserve_node_test.sh)
set_tests_properties(kserve_node_test PROPERTIES TIMEOUT 600 SKIP_RETURN_CODE 77 LABELS "e2e;kserve"
  ENVIRONMENT "DRAFTHEAD_BIN_DIR=${CMAKE_BINARY_DIR};DRAFTHEAD_SOURCE_DIR=${CMAKE_SOURCE_DIR}")

if(DRAFTHEAD_PYTHON)
  # The KServe stubs come with the installed client package (drafthead_client._gen.inference).
  add_test(NAME kserve_python_test COMMAND ${DRAFTHEAD_VENV_PYTHON} ${CMAKE_CURRENT_SOURCE_DIR}/kserve_python_test.py)
  set_tests_properties(kserve_python_test PROPERTIES TIMEOUT 300 LABELS "e2e;kserve" FIXTURES_REQUIRED python_venv
    ENVIRONMENT "DRAFTHEAD_BIN_DIR=${CMAKE_BINARY_DIR};DRAFTHEAD_SOURCE_DIR=${CMAKE_SOURCE_DIR}")
  add_test(NAME kserve_client_habits_test COMMAND ${DRAFTHEAD_VENV_PYTHON} ${CMAKE_CURRENT_SOURCE_DIR}/kserve_client_habits_test.py)
  set_tests_properties(kserve_client_habits_test PROPERTIES TIMEOUT 300 LABELS "e2e;kserve" FIXTURES_REQUIRED python_venv
    ENVIRONMENT "DRAFTHEAD_BIN_DIR=${CMAKE_BINARY_DIR}")
endif()
