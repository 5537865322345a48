# The metrics: test_metrics (CMocka, also under ThreadSanitizer: its
# endpoint test scrapes while a load runs), and the real Prometheus tools
# on its output (label "prometheus"; skipped with a reason when the
# Debian package prometheus is not installed).
if(TEST test_metrics)
  set_property(TEST test_metrics APPEND PROPERTY LABELS threads metrics)
  add_test(NAME metrics_promtool
    COMMAND sh ${CMAKE_CURRENT_SOURCE_DIR}/metrics/promtool.sh $<TARGET_FILE:test_metrics>)
  set_tests_properties(metrics_promtool PROPERTIES LABELS "prometheus;metrics"
    SKIP_RETURN_CODE 77 TIMEOUT 120)
endif()
if(TEST test_metrics)
  add_test(NAME metrics_prometheus
    COMMAND sh ${CMAKE_CURRENT_SOURCE_DIR}/metrics/prometheus.sh $<TARGET_FILE:test_metrics>)
  set_tests_properties(metrics_prometheus PROPERTIES LABELS "prometheus;metrics"
    SKIP_RETURN_CODE 77 TIMEOUT 150)
endif()
