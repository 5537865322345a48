# test_threads_start fails the Nth pthread_create through a link-time
# wrapper (its __wrap_pthread_create): --wrap sends the static library's
# calls there too, so a component's worker start can fail part way.
if(TARGET test_threads_start)
  target_link_options(test_threads_start PRIVATE -Wl,--wrap=pthread_create)
endif()
