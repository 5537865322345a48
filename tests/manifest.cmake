# test_manifest_oom fails the Nth allocation through link-time wrappers,
# like test_alloc_fail (see alloc.cmake).
if(TARGET test_manifest_oom)
  target_link_options(test_manifest_oom PRIVATE
    -Wl,--wrap=malloc,--wrap=calloc,--wrap=realloc,--wrap=strdup)
endif()
