# test_verify_faults: the fallbacks of sluice_verify's O_DIRECT path, each
# fault made by verify_faults_shim.c, preloaded (LD_PRELOAD) into a child
# run of the test. The shim is built like everything else (sanitizers
# included); the test gives its child verify_asan_link_order=0.
if(TARGET test_verify_faults)
  add_library(verify_faults_shim MODULE verify_faults_shim.c)
  target_compile_options(verify_faults_shim PRIVATE ${SLUICE_WARNINGS})
  target_link_libraries(verify_faults_shim PRIVATE PkgConfig::URING Threads::Threads ${CMAKE_DL_LIBS})
  add_dependencies(test_verify_faults verify_faults_shim)
  target_compile_definitions(test_verify_faults PRIVATE
    VFS_SHIM="$<TARGET_FILE:verify_faults_shim>")
  target_link_libraries(test_verify_faults PRIVATE ${CMAKE_DL_LIBS})
  # Each child has its own 60 s alarm; this bounds the whole program.
  # 77: skipped, saying why (no O_DIRECT on the temp folder, no io_uring).
  set_tests_properties(test_verify_faults PROPERTIES TIMEOUT 300 SKIP_RETURN_CODE 77)
  # Its last case runs 4 threads through the fallbacks: under TSan too.
  set_property(TEST test_verify_faults APPEND PROPERTY LABELS threads)
endif()
