# The tests of `sluice serve` (tests/serve/serve_test.sh): the real server
# process and the C++ client example on 127.0.0.1, one ctest per case so
# that they run in parallel. Only when the server is built (grpc++ found).
if(SLUICE_BUILD_TOOLS AND SLUICE_HAVE_GRPC)
  foreach(case IN ITEMS fetch errors security shutdown load transport flood replicas remote balance)
    add_test(NAME serve_${case}
      COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/serve/serve_test.sh
              ${PROJECT_BINARY_DIR} ${SLUICE_REAL_DATA} ${case})
    set_tests_properties(serve_${case} PROPERTIES TIMEOUT 300 LABELS serve SKIP_RETURN_CODE 77)
  endforeach()
endif()
