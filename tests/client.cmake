# tests for client (fragment of tests/CMakeLists.txt): the client library, the load tester and its
# reports, the CLI and the Python client, against drafthead-fake-server on
# 127.0.0.1 (every load loop bounded in requests and time).
drafthead_add_test(client_histogram_test SOURCES client_histogram_test.cc LIBS drafthead_client LABELS client TIMEOUT 120)
drafthead_add_test(client_library_test SOURCES client_library_test.cc LIBS drafthead_client LABELS client TIMEOUT 180)
drafthead_add_test(client_load_test SOURCES client_load_test.cc LIBS drafthead_load LABELS client TIMEOUT 300)
drafthead_add_test(lane_ring_test SOURCES lane_ring_test.cc LIBS drafthead_lane_ring LABELS client TIMEOUT 120)
# The C ABI's sources built into the test (the shipped library is never sanitized: Python loads it).
drafthead_add_test(lane_c_api_test SOURCES lane_c_api_test.cc ${PROJECT_SOURCE_DIR}/client/lane/lane_c_api.cc
                   ${PROJECT_SOURCE_DIR}/client/lane/lane_cuda.cc LIBS drafthead_lane_ring ${CMAKE_DL_LIBS}
                   LABELS client TIMEOUT 120)
drafthead_add_test(native_grpc_split_test SOURCES native_grpc_split_test.cc LIBS drafthead_grpc_c gRPC::grpc++
                   LABELS client TIMEOUT 120)
# The tests start the fake server binary as a child process.
add_dependencies(client_library_test drafthead-fake-server)
add_dependencies(client_load_test drafthead-fake-server)

if(DRAFTHEAD_PYTHON)
  # The Python tests run the installed package: client_python_install builds nothing, it installs
  # the wheel (drafthead_python_wheel, part of the build) into a fresh venv that sees Debian's
  # grpcio, protobuf and numpy (--system-site-packages); the tests run its python with no PYTHONPATH.
  set(DRAFTHEAD_VENV_PYTHON ${DRAFTHEAD_PYTHON_DIR}/venv/bin/python CACHE INTERNAL "the installed client's python")
  # DRAFTHEAD_LANE_SO: the lane's library when the build has it; then the wheel must carry it.
  set(_client_py_env "DRAFTHEAD_BIN_DIR=${CMAKE_BINARY_DIR}" "DRAFTHEAD_SOURCE_DIR=${CMAKE_SOURCE_DIR}"
                     "DRAFTHEAD_PYTHON=${DRAFTHEAD_PYTHON}"
                     "DRAFTHEAD_LANE_SO=$<$<TARGET_EXISTS:drafthead_lane_c>:$<TARGET_FILE:drafthead_lane_c>>")
  add_test(NAME client_python_install COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/client_python_install.sh
           ${DRAFTHEAD_PYTHON} ${DRAFTHEAD_PYTHON_DIR})
  set_tests_properties(client_python_install PROPERTIES FIXTURES_SETUP python_venv TIMEOUT 300 LABELS client)
  # The package type-checks (Debian's mypy; config in client/python/pyproject.toml).
  add_test(NAME client_python_mypy COMMAND ${DRAFTHEAD_PYTHON} -m mypy -p drafthead_client
           WORKING_DIRECTORY ${DRAFTHEAD_PYTHON_DIR}/pkg)
  set_tests_properties(client_python_mypy PROPERTIES TIMEOUT 300 LABELS client)
  set(_py_tests client_python_test client_cli_test)
  # Against the real CPU server (tiny shapes), when it is built: Python client == C++ client; the
  # installed package in every mode, sync and asyncio; docs/client.md's examples; shared-memory
  # regions from Python and the DSpark adapter (POSIX regions); the same-host lane from Python
  # (the installed package's own libdrafthead_lane.so, drafthead_client/_native); a server on a
  # Unix socket (--listen=unix:PATH) called from the C++ CLI, load tester and Python; the native
  # unary call (libdrafthead_grpc.so) against grpcio's.
  if(TARGET drafthead-server)
    list(APPEND _py_tests client_e2e_parity_test client_package_test client_docs_test dspark_adapter_test
                          client_regions_test client_lane_test client_unix_socket_test client_native_grpc_test)
  endif()
  foreach(_t ${_py_tests})
    add_test(NAME ${_t} COMMAND ${DRAFTHEAD_VENV_PYTHON} ${CMAKE_CURRENT_SOURCE_DIR}/${_t}.py)
    set_tests_properties(${_t} PROPERTIES ENVIRONMENT "${_client_py_env}" TIMEOUT 300 LABELS client
                         FIXTURES_REQUIRED python_venv)
  endforeach()
  if(TARGET drafthead-server)
    set_property(TEST client_e2e_parity_test client_package_test client_docs_test dspark_adapter_test
                 client_regions_test client_lane_test client_unix_socket_test client_native_grpc_test
                 APPEND PROPERTY LABELS e2e)
  endif()
endif()
