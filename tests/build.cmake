# Tests of the build itself: the header alone, and an installed package
# used from outside.
find_program(SLUICE_CXX NAMES g++ c++ clang++)
add_test(NAME header_c99_cxx
  COMMAND sh ${CMAKE_CURRENT_SOURCE_DIR}/headertest/check.sh
          ${PROJECT_SOURCE_DIR}/include ${CMAKE_C_COMPILER} ${SLUICE_CXX})

# The consumer is built with the sanitizer flags of this build so that it
# links against an instrumented library.
set(SLUICE_CONSUMER_CFLAGS "")
if(SLUICE_SANITIZE)
  set(SLUICE_CONSUMER_CFLAGS "-fsanitize=address,undefined")
elseif(SLUICE_TSAN)
  set(SLUICE_CONSUMER_CFLAGS "-fsanitize=thread")
endif()
add_test(NAME packaging
  COMMAND sh ${CMAKE_CURRENT_SOURCE_DIR}/package/check.sh
          ${PROJECT_SOURCE_DIR} ${PROJECT_BINARY_DIR} ${SLUICE_REAL_DATA}/safetensors__overall.safetensors)
set_tests_properties(packaging PROPERTIES
  ENVIRONMENT "SLUICE_CONSUMER_CFLAGS=${SLUICE_CONSUMER_CFLAGS}" TIMEOUT 300)
