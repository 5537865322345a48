# The README's runnable blocks (tests/readme/run_readme.sh), in a temporary
# directory with the built sluice, sluice-serve and serve_client first on
# PATH; its C block is compiled with this build's compiler and sanitizers
# against include/ and the built libsluice.so.
if(SLUICE_BUILD_TOOLS)
  set(_readme_cc "${CMAKE_C_COMPILER}")
  if(SLUICE_SANITIZE)
    string(APPEND _readme_cc " -fsanitize=address,undefined")
  endif()
  if(SLUICE_TSAN)
    string(APPEND _readme_cc " -fsanitize=thread")
  endif()
  add_test(NAME readme_examples
    COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/readme/run_readme.sh ${PROJECT_BINARY_DIR}
            ${PROJECT_SOURCE_DIR} "${_readme_cc}")
  set_tests_properties(readme_examples PROPERTIES TIMEOUT 300 SKIP_RETURN_CODE 77)
endif()

# README.md stays within 250 lines (detail goes to docs/).
add_test(NAME readme_length
  COMMAND /usr/bin/python3 ${CMAKE_CURRENT_SOURCE_DIR}/readme/check_length.py
          ${PROJECT_SOURCE_DIR}/README.md 250)
set_tests_properties(readme_length PROPERTIES TIMEOUT 30)
