# The tests of `sluice serve` (tests/serve/serve_test.sh): the real server
# process and the C++ client example on 127.0.0.1, one ctest per case so
# that they run in parallel. Only when the server is built (grpc++ found).
if(SLUICE_BUILD_TOOLS AND SLUICE_HAVE_GRPC)
  foreach(case IN ITEMS fetch errors security shutdown load transport flood replicas remote balance)
    add_test(NAME serve_${case}
      COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/serve/serve_test.sh
              ${PROJECT_BINARY_DIR} ${SLUICE_REAL_DATA} ${case})
    # 600 s: serve_replicas took 161 s beside stress-ng --cpu 4 on 2 CPUs
    # (40 s unloaded); every wait inside is bounded on its own.
    set_tests_properties(serve_${case} PROPERTIES TIMEOUT 600 LABELS serve SKIP_RETURN_CODE 77)
  endforeach()
endif()
# HTTP/2 attacks (tests/serve/attack_cases.sh, cases of serve_test.sh,
# tests/serve/h2attack.py): rapid reset, control-frame floods, idle
# connections, a half-close.
if(SLUICE_BUILD_TOOLS AND SLUICE_HAVE_GRPC)
  foreach(case IN ITEMS reset control idle halfclose)
    add_test(NAME serve_attack_${case}
      COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/serve/serve_test.sh
              ${PROJECT_BINARY_DIR} ${SLUICE_REAL_DATA} attack_${case})
    set_tests_properties(serve_attack_${case} PROPERTIES TIMEOUT 300 LABELS serve)
  endforeach()
  # The relay's client address key (an IPv6 /64 is one address): no
  # second IPv6 address to connect from on a test machine.
  add_executable(test_relay_address serve/test_relay_address.cc
    ${PROJECT_SOURCE_DIR}/tools/serve/relay.cc)
  target_include_directories(test_relay_address PRIVATE ${PROJECT_SOURCE_DIR}/tools/serve)
  target_link_libraries(test_relay_address PRIVATE PkgConfig::LIBSSL PkgConfig::CRYPTO Threads::Threads)
  add_test(NAME serve_relay_address COMMAND test_relay_address)
  set_tests_properties(serve_relay_address PROPERTIES LABELS serve)
endif()
