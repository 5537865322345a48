# test_remote starts nginx, test_remote_faults the tests' own fault server
# (remote_fault_server.py, python3); both skip (77) when they cannot.
target_compile_definitions(test_remote_faults PRIVATE
  SLUICE_FAULT_SERVER="${CMAKE_CURRENT_SOURCE_DIR}/remote_fault_server.py")
set_tests_properties(test_remote test_remote_faults PROPERTIES LABELS "remote;threads" TIMEOUT 300)
