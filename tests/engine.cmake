# The engine's test programs run a second time on the pread backend
# (SLUICE_FORCE_PREAD=1): both backends must pass the same suite.
foreach(name IN ITEMS test_engine test_engine_faults test_engine_stress test_io_faults test_file_change
                    test_engine_regress test_part_engine)
  if(TARGET ${name})
    add_test(NAME ${name}_pread COMMAND ${name})
    set_tests_properties(${name}_pread PROPERTIES
      ENVIRONMENT SLUICE_FORCE_PREAD=1 SKIP_RETURN_CODE 77 TIMEOUT 600)
  endif()
endforeach()

# The tests that run many threads on one model also run under
# ThreadSanitizer (tools/test.sh: ctest -L threads in the TSan build).
foreach(name IN ITEMS test_engine test_engine_pread test_engine_stress test_engine_stress_pread test_verify
                    test_engine_regress test_engine_regress_pread
                    test_io_faults test_io_faults_pread test_io_retry test_errmsg test_verify_only
                    test_chunks test_hash test_cache test_parts test_part_engine test_part_engine_pread)
  if(TEST ${name})
    set_property(TEST ${name} APPEND PROPERTY LABELS threads)
  endif()
endforeach()
