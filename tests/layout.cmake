# src/'s includes against the layer table of docs/layout.md.
add_test(NAME layout_layers
  COMMAND /usr/bin/python3 ${CMAKE_CURRENT_SOURCE_DIR}/layout/check_layers.py
          ${PROJECT_SOURCE_DIR}/src ${PROJECT_SOURCE_DIR}/docs/layout.md)
set_tests_properties(layout_layers PROPERTIES TIMEOUT 60)

# src/ asks a source's kind in one place (source.h: a table per kind).
add_test(NAME layout_sources
  COMMAND /usr/bin/python3 ${CMAKE_CURRENT_SOURCE_DIR}/layout/check_sources.py
          ${PROJECT_SOURCE_DIR}/src)
set_tests_properties(layout_sources PROPERTIES TIMEOUT 60)
