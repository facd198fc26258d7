# Deployment tests (deploy/: container images, compose, Kubernetes), all without a container
# engine or a cluster: the entrypoint and health check against the real server on loopback, the
# manifests parsed and checked, the Dockerfile linted, and the CPU image's build script run.
find_program(DRAFTHEAD_BASH bash REQUIRED)
find_program(DRAFTHEAD_PYTHON3 python3 REQUIRED)
set(_deploy_env "DRAFTHEAD_BIN_DIR=${CMAKE_BINARY_DIR};DRAFTHEAD_SOURCE_DIR=${CMAKE_SOURCE_DIR}")

add_test(NAME deploy_manifests COMMAND ${DRAFTHEAD_PYTHON3} ${CMAKE_CURRENT_SOURCE_DIR}/deploy_manifests_test.py)
add_test(NAME deploy_dockerfile_lint COMMAND ${DRAFTHEAD_PYTHON3} ${CMAKE_CURRENT_SOURCE_DIR}/deploy_dockerfile_lint.py)
set_tests_properties(deploy_manifests deploy_dockerfile_lint PROPERTIES TIMEOUT 120 LABELS deploy ENVIRONMENT "${_deploy_env}")
# The two that start servers test the deployment path with the shipped (non-sanitized) build: under
# ASan a leak report at exit would turn a clean drain into a failure that says nothing about deploy/,
# and the images are never built with sanitizers.
if(DRAFTHEAD_SANITIZE)
  return()
endif()
add_test(NAME deploy_entrypoint COMMAND ${DRAFTHEAD_BASH} ${CMAKE_CURRENT_SOURCE_DIR}/deploy_entrypoint_test.sh)
add_test(NAME deploy_build COMMAND ${DRAFTHEAD_BASH} ${CMAKE_CURRENT_SOURCE_DIR}/deploy_build_test.sh)
set_tests_properties(deploy_entrypoint deploy_build PROPERTIES TIMEOUT 600 LABELS deploy ENVIRONMENT "${_deploy_env}")
# The two that start servers need the programs; the build test also takes drafthead-quantize.
foreach(_t deploy_entrypoint deploy_build)
  set_property(TEST ${_t} APPEND PROPERTY REQUIRED_FILES
    ${CMAKE_BINARY_DIR}/server/drafthead-server ${CMAKE_BINARY_DIR}/client/drafthead-client)
endforeach()
set_property(TEST deploy_build APPEND PROPERTY REQUIRED_FILES ${CMAKE_BINARY_DIR}/tools/drafthead-quantize)

# The CPU image built with podman from a locally debootstrap'd base and run as in production
# (tests/deploy_container_test.py). Exit 77 (skipped, with the reason) only where this machine
# cannot run containers at all. Run alone: the image build compiles the project on every core
# (~10-15 min on 2 cores), which would only slow the tests beside it.
if(DRAFTHEAD_PYTHON)
  add_test(NAME deploy_container COMMAND ${DRAFTHEAD_VENV_PYTHON} ${CMAKE_CURRENT_SOURCE_DIR}/deploy_container_test.py)
  set_tests_properties(deploy_container PROPERTIES TIMEOUT 3600 LABELS "deploy;container" SKIP_RETURN_CODE 77
    RUN_SERIAL TRUE FIXTURES_REQUIRED python_venv ENVIRONMENT "${_deploy_env}"
    REQUIRED_FILES "${CMAKE_BINARY_DIR}/server/drafthead-server;${CMAKE_BINARY_DIR}/client/drafthead-client")
endif()
