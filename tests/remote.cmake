# test_remote and test_mirrors start nginx, test_remote_faults the tests' own fault server
# (remote_fault_server.py, python3), test_remote_s3 s3rver (installed with
# npm into the build folder on its first run); each skips (77) when it
# cannot.
target_compile_definitions(test_remote_faults PRIVATE
  SLUICE_FAULT_SERVER="${CMAKE_CURRENT_SOURCE_DIR}/remote_fault_server.py")
# test_remote_faults refuses the verifying threads their fetchers through a
# link-time wrapper (its __wrap_pthread_create, as test_threads_start's)
target_link_options(test_remote_faults PRIVATE -Wl,--wrap=pthread_create)
set_tests_properties(test_remote test_remote_faults PROPERTIES LABELS "remote;threads" TIMEOUT 300)
set_tests_properties(test_remote_s3 PROPERTIES LABELS "remote" TIMEOUT 600)
# test_remote_proxy: nginx, squid and the fault server (as a proxy)
target_compile_definitions(test_remote_proxy PRIVATE
  SLUICE_FAULT_SERVER="${CMAKE_CURRENT_SOURCE_DIR}/remote_fault_server.py")
set_tests_properties(test_remote_proxy PROPERTIES LABELS "remote;threads" TIMEOUT 300)
set_tests_properties(test_mirrors PROPERTIES LABELS "remote;threads" TIMEOUT 300)
set_tests_properties(test_remote_signatures PROPERTIES LABELS "remote" TIMEOUT 300)
