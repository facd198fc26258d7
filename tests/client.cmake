# tests for client (fragment of tests/CMakeLists.txt): the client library, the load tester and its
# reports, the CLI and the Python client, against drafthead-fake-server on
# 127.0.0.1 (every load loop bounded in requests and time).
drafthead_add_test(client_histogram_test SOURCES client_histogram_test.cc LIBS drafthead_client LABELS client TIMEOUT 120)
drafthead_add_test(client_library_test SOURCES client_library_test.cc LIBS drafthead_client LABELS client TIMEOUT 180)
drafthead_add_test(client_load_test SOURCES client_load_test.cc LIBS drafthead_load LABELS client TIMEOUT 300)
# The tests start the fake server binary as a child process.
add_dependencies(client_library_test drafthead-fake-server)
add_dependencies(client_load_test drafthead-fake-server)

if(DRAFTHEAD_PYTHON)
  set(_client_py_env
    "PYTHONPATH=${CMAKE_SOURCE_DIR}/client/python:${DRAFTHEAD_PYTHON_GEN}"
    "DRAFTHEAD_BIN_DIR=${CMAKE_BINARY_DIR}"
    "DRAFTHEAD_SOURCE_DIR=${CMAKE_SOURCE_DIR}"
    "DRAFTHEAD_LANE_LIB=$<TARGET_FILE:drafthead_lane_c>")
  foreach(_t client_python_test client_cli_test)
    add_test(NAME ${_t} COMMAND ${DRAFTHEAD_PYTHON} ${CMAKE_CURRENT_SOURCE_DIR}/${_t}.py)
    set_tests_properties(${_t} PROPERTIES ENVIRONMENT "${_client_py_env}" TIMEOUT 300 LABELS client)
  endforeach()
  # Python client == C++ client against the real CPU server (tiny shapes), when it is built.
  if(TARGET drafthead-server)
    add_test(NAME client_e2e_parity_test COMMAND ${DRAFTHEAD_PYTHON} ${CMAKE_CURRENT_SOURCE_DIR}/client_e2e_parity_test.py)
    set_tests_properties(client_e2e_parity_test PROPERTIES ENVIRONMENT "${_client_py_env}" TIMEOUT 300 LABELS "client;e2e")
    # Shared-memory regions from Python and the DSpark adapter (POSIX regions, CPU server).
    foreach(_t dspark_adapter_test client_regions_test client_lane_test)
      add_test(NAME ${_t} COMMAND ${DRAFTHEAD_PYTHON} ${CMAKE_CURRENT_SOURCE_DIR}/${_t}.py)
      set_tests_properties(${_t} PROPERTIES ENVIRONMENT "${_client_py_env}" TIMEOUT 300 LABELS "client;e2e")
    endforeach()
  endif()
endif()
