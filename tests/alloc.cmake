# The out-of-memory tests fail the Nth allocation through link-time
# wrappers: tests/alloc_wrap.c holds the __wrap_ functions, and --wrap
# sends the allocation calls of the test and of the static library there
# (see alloc_wrap.h).
set(SLUICE_ALLOC_WRAP_FLAGS
  -Wl,--wrap=malloc,--wrap=calloc,--wrap=realloc,--wrap=strdup,--wrap=posix_memalign,--wrap=aligned_alloc)
foreach(name IN ITEMS test_alloc_fail test_manifest_oom)
  if(TARGET ${name})
    target_sources(${name} PRIVATE ${CMAKE_CURRENT_SOURCE_DIR}/alloc_wrap.c)
    target_link_options(${name} PRIVATE ${SLUICE_ALLOC_WRAP_FLAGS})
  endif()
endforeach()
