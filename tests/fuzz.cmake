# Replays every fuzz corpus under ctest with the ordinary compiler, so
# every past crasher stays fixed (tests/data/bad grows with each bug), and
# every file of fuzz/verdicts.txt is rejected with its code.
foreach(target IN ITEMS fuzz_header fuzz_index fuzz_manifest fuzz_model fuzz_signature fuzz_msign fuzz_msign_statement)
  string(REPLACE "fuzz_" "" corpus ${target})
  add_executable(${target}_replay ${CMAKE_CURRENT_SOURCE_DIR}/fuzz/${target}.c ${CMAKE_CURRENT_SOURCE_DIR}/fuzz/replay.c)
  target_link_libraries(${target}_replay PRIVATE sluice_testutil)
  set(dirs ${CMAKE_CURRENT_SOURCE_DIR}/fuzz/corpus/${corpus} ${CMAKE_CURRENT_SOURCE_DIR}/data/bad)
  if(EXISTS ${SLUICE_REAL_DATA})
    list(APPEND dirs ${SLUICE_REAL_DATA})
  endif()
  # verdicts.txt: the files that must be rejected, and with which code
  add_test(NAME ${target}_replay COMMAND ${target}_replay
    --verdicts ${CMAKE_CURRENT_SOURCE_DIR}/fuzz/verdicts.txt ${dirs})
endforeach()
