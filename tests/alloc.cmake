# test_alloc_fail fails the Nth allocation through link-time wrappers.
if(TARGET test_alloc_fail)
  target_link_options(test_alloc_fail PRIVATE
    -Wl,--wrap=malloc,--wrap=calloc,--wrap=realloc,--wrap=strdup,--wrap=posix_memalign,--wrap=aligned_alloc)
endif()
