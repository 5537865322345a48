# ctest onnx_engine (tests/onnx/engine_test.py): the C engine over ONNX
# Runtime's C API (examples/onnx_engine.c) runs hand-made ONNX blocks whose
# weights are external and absent, with weights sluice reads on demand:
# bit-equal to the same graphs with embedded weights, zero copy, failures
# before the block or before any block. Skipped (77), with the reason,
# when CMake did not find ONNX Runtime (tools/ort.sh fetches it) or
# python3-onnx is missing.
if(SLUICE_BUILD_TOOLS)
  if(SLUICE_HAVE_ORT)
    add_test(NAME onnx_engine
      COMMAND /usr/bin/python3 ${CMAKE_CURRENT_SOURCE_DIR}/onnx/engine_test.py
              $<TARGET_FILE:onnx_engine> $<TARGET_FILE:sluice_cli> ${PROJECT_SOURCE_DIR})
  else()
    add_test(NAME onnx_engine
      COMMAND /usr/bin/python3 ${CMAKE_CURRENT_SOURCE_DIR}/onnx/engine_test.py --absent
              "${SLUICE_ORT_WHY}")
  endif()
  set_tests_properties(onnx_engine PROPERTIES TIMEOUT 600 SKIP_RETURN_CODE 77 LABELS onnx)
endif()
