# The examples, run: examples/pinned_upload.c on a model with chunk
# digests, then with one byte flipped (tests/examples/pinned_upload.sh).
if(TARGET pinned_upload AND TARGET sluice_cli)
  add_test(NAME example_pinned_upload
    COMMAND sh ${CMAKE_CURRENT_SOURCE_DIR}/examples/pinned_upload.sh
            $<TARGET_FILE:pinned_upload> $<TARGET_FILE:sluice_cli>)
  set_tests_properties(example_pinned_upload PROPERTIES TIMEOUT 120)
endif()
