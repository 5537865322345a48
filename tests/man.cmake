# The man pages (built from man/*.scd when scdoc is found): one per public
# function (or group, with aliases) and per subcommand, each rendered by
# man(1) without a warning (tests/man/check_man.sh).
if(SLUICE_HAVE_MAN)
  add_test(NAME man_pages
    COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/man/check_man.sh ${PROJECT_BINARY_DIR}/man
            ${PROJECT_SOURCE_DIR}/include/sluice.h $<TARGET_FILE:sluice_cli>)
  set_tests_properties(man_pages PROPERTIES TIMEOUT 300 SKIP_RETURN_CODE 77)
endif()
