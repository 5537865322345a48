# examples/onnx_engine.c: a C engine running ONNX blocks exported with
# their weights external and absent (plan.json, docs/onnx.md) on ONNX
# Runtime's C API, with weights sluice reads, verifies and hands over in
# place. Optional: built when CMake finds ONNX Runtime (SLUICE_WITH_ORT, on
# by default): ORT_ROOT (a folder with include/onnxruntime_c_api.h and
# lib/libonnxruntime.so), else the folder tools/ort.sh fills
# (~/.cache/sluice/ort-1.29.0). Debian does not package ONNX Runtime. The
# library itself never links it: the engine uses sluice.h only. Its test
# (onnx_engine) is in tests/onnx.cmake.
option(SLUICE_WITH_ORT "examples/onnx_engine (C, ONNX Runtime's C API), when ONNX Runtime is found" ON)
set(ORT_ROOT "$ENV{ORT_ROOT}" CACHE PATH
    "ONNX Runtime: a folder with include/onnxruntime_c_api.h and lib/libonnxruntime.so (tools/ort.sh)")
set(SLUICE_HAVE_ORT OFF)
set(SLUICE_ORT_WHY "SLUICE_WITH_ORT is OFF")
if(SLUICE_WITH_ORT)
  set(_ort_hints)
  if(ORT_ROOT)
    list(APPEND _ort_hints ${ORT_ROOT})
  endif()
  if(DEFINED ENV{XDG_CACHE_HOME} AND NOT "$ENV{XDG_CACHE_HOME}" STREQUAL "")
    list(APPEND _ort_hints $ENV{XDG_CACHE_HOME}/sluice/ort-1.29.0)
  elseif(DEFINED ENV{HOME})
    list(APPEND _ort_hints $ENV{HOME}/.cache/sluice/ort-1.29.0)
  endif()
  find_path(ORT_INCLUDE_DIR onnxruntime_c_api.h HINTS ${_ort_hints} PATH_SUFFIXES include
            include/onnxruntime)
  find_library(ORT_LIBRARY NAMES onnxruntime libonnxruntime.so.1 HINTS ${_ort_hints}
               PATH_SUFFIXES lib lib64)
  if(ORT_INCLUDE_DIR AND ORT_LIBRARY)
    set(SLUICE_HAVE_ORT ON)
  else()
    set(SLUICE_ORT_WHY "ONNX Runtime not found (sh tools/ort.sh fetches it; or -DORT_ROOT=DIR)")
    message(STATUS "${SLUICE_ORT_WHY}: no onnx_engine")
  endif()
endif()
message(STATUS "onnx_engine (ONNX Runtime): ${SLUICE_HAVE_ORT}")
if(NOT SLUICE_HAVE_ORT)
  return()
endif()

add_executable(onnx_engine ${PROJECT_SOURCE_DIR}/examples/onnx_engine.c)
target_include_directories(onnx_engine SYSTEM PRIVATE ${ORT_INCLUDE_DIR})
target_compile_options(onnx_engine PRIVATE ${SLUICE_WARNINGS})
if(SLUICE_SANITIZE)
  # the plan's numbers are doubles (cJSON): a cast past int64_t is caught
  target_compile_options(onnx_engine PRIVATE -fsanitize=float-cast-overflow)
  target_link_options(onnx_engine PRIVATE -fsanitize=float-cast-overflow)
endif()
# The library's folder in the build RPATH (CMake's default for a full
# path), so the engine starts without LD_LIBRARY_PATH.
target_link_libraries(onnx_engine PRIVATE sluice ${ORT_LIBRARY} PkgConfig::CRYPTO PkgConfig::CJSON)
