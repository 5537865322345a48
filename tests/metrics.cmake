# The metrics: test_metrics (CMocka, also under ThreadSanitizer: its
# endpoint test scrapes while a load runs), and the real Prometheus tools
# on its output (label "prometheus"; skipped with a reason when the
# Debian package prometheus is not installed).
set(SLUICE_METRICS_ASAN "")
if(TEST test_metrics)
  set_property(TEST test_metrics APPEND PROPERTY LABELS threads metrics)
  if(SLUICE_SANITIZE)
    # The endpoint test bounds RSS growth over a load of thousands of
    # scrapes; ASan's default 256 MiB quarantine of freed blocks grows
    # with the number of rounds a busy machine fits in, and once crossed
    # the 64 MiB bound in CI. A 16 MiB quarantine keeps the bound about
    # the library's memory, not the sanitizer's.
    set(SLUICE_METRICS_ASAN "ASAN_OPTIONS=detect_leaks=1:abort_on_error=1:quarantine_size_mb=16")
    set_property(TEST test_metrics APPEND PROPERTY ENVIRONMENT ${SLUICE_METRICS_ASAN})
  endif()
  add_test(NAME metrics_promtool
    COMMAND sh ${CMAKE_CURRENT_SOURCE_DIR}/metrics/promtool.sh $<TARGET_FILE:test_metrics>)
  set_tests_properties(metrics_promtool PROPERTIES LABELS "prometheus;metrics"
    SKIP_RETURN_CODE 77 TIMEOUT 120 ENVIRONMENT "${SLUICE_METRICS_ASAN}")
endif()
if(TEST test_metrics)
  add_test(NAME metrics_prometheus
    COMMAND sh ${CMAKE_CURRENT_SOURCE_DIR}/metrics/prometheus.sh $<TARGET_FILE:test_metrics>)
  set_tests_properties(metrics_prometheus PROPERTIES LABELS "prometheus;metrics"
    SKIP_RETURN_CODE 77 TIMEOUT 150 ENVIRONMENT "${SLUICE_METRICS_ASAN}")
endif()
# The endpoint's bounds against slow and wrong clients (slow-header
# clients cut by the whole-request deadline, the per-address cap, 405 with
# Allow for any other method): tests/metrics/http_limits.py, shared with
# serve_metrics (sluice serve's own endpoint), against test_metrics --serve.
if(TEST test_metrics)
  add_test(NAME metrics_http_limits
    COMMAND /usr/bin/python3 ${CMAKE_CURRENT_SOURCE_DIR}/metrics/http_limits.py
            --library $<TARGET_FILE:test_metrics>)
  set_tests_properties(metrics_http_limits PROPERTIES LABELS "metrics;threads"
    SKIP_RETURN_CODE 77 TIMEOUT 120 ENVIRONMENT "${SLUICE_METRICS_ASAN}")
endif()
