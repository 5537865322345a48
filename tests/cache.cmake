# test_cache makes and inspects index databases with SQLite itself (and
# test_cache_load holds an index's write lock with it), and the cache
# tests fill a cache through src/cache/cache.c: built without SQLite they check
# only that the cache says so.
foreach(name IN ITEMS test_cache test_cache_tools test_cache_load)
  if(TARGET ${name} AND SLUICE_HAVE_SQLITE)
    target_compile_definitions(${name} PRIVATE SLUICE_HAVE_SQLITE)
    target_link_libraries(${name} PRIVATE PkgConfig::SQLITE3)
  endif()
endforeach()
# test_cache_tools runs the sluice command.
if(TARGET test_cache_tools AND TARGET sluice_cli)
  add_dependencies(test_cache_tools sluice_cli)
endif()
# test_cache_load loads remote models from the test's own nginx (it skips,
# 77, without nginx or libcurl) and runs the sluice command to make its
# model; its threads share one cache, so it also runs under TSan.
if(TARGET test_cache_load)
  if(TARGET sluice_cli)
    add_dependencies(test_cache_load sluice_cli)
  endif()
  set_tests_properties(test_cache_load PROPERTIES LABELS "remote;threads" TIMEOUT 300)
endif()
