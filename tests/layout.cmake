# src/'s includes, and the calls between the library's objects (nm), against
# the layer table of docs/layout.md.
set(_layout_nm "${CMAKE_NM}")
if(NOT _layout_nm)
  set(_layout_nm nm)
endif()
add_test(NAME layout_layers
  COMMAND /usr/bin/python3 ${CMAKE_CURRENT_SOURCE_DIR}/layout/check_layers.py
          ${PROJECT_SOURCE_DIR}/src ${PROJECT_SOURCE_DIR}/docs/layout.md
          --nm ${_layout_nm} --objects $<TARGET_OBJECTS:sluice_objects>
  COMMAND_EXPAND_LISTS)
set_tests_properties(layout_layers PROPERTIES TIMEOUT 60)

# The calls check fails on a planted upward call and a planted loop (small C
# files compiled with this build's compiler into fake layer folders).
add_test(NAME layout_layers_planted
  COMMAND /usr/bin/python3 ${CMAKE_CURRENT_SOURCE_DIR}/layout/planted.py
          ${CMAKE_CURRENT_SOURCE_DIR}/layout/check_layers.py ${CMAKE_C_COMPILER} ${_layout_nm})
set_tests_properties(layout_layers_planted PROPERTIES TIMEOUT 60)

# src/ asks a source's kind in one place (source.h: a table per kind).
add_test(NAME layout_sources
  COMMAND /usr/bin/python3 ${CMAKE_CURRENT_SOURCE_DIR}/layout/check_sources.py
          ${PROJECT_SOURCE_DIR}/src)
set_tests_properties(layout_sources PROPERTIES TIMEOUT 60)
