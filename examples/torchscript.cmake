# examples/torchscript_engine.cc: a C++ engine running TorchScript blocks
# exported without weights (sluice.torch.export_blocks) with weights sluice
# reads and verifies on demand. Optional: built when CMake finds libtorch's
# package (Debian: libtorch-dev; SLUICE_WITH_TORCH, on by default). The
# library itself stays C and gains no libtorch dependency: the engine uses
# sluice.h only. Its test (torchscript_engine) is in tests/CMakeLists.txt.
option(SLUICE_WITH_TORCH "examples/torchscript_engine (C++17, libtorch), when Torch is found" ON)
set(SLUICE_HAVE_TORCH OFF)
if(SLUICE_WITH_TORCH)
  enable_language(CXX)
  # QUIET: Caffe2's config warns about CUDA and the like on a CPU-only libtorch.
  find_package(Torch QUIET)
  if(Torch_FOUND OR TORCH_FOUND)
    set(SLUICE_HAVE_TORCH ON)
  else()
    message(STATUS "Torch not found (apt-get install -y libtorch-dev): no torchscript_engine")
  endif()
endif()
message(STATUS "torchscript_engine (libtorch): ${SLUICE_HAVE_TORCH}")
if(NOT SLUICE_HAVE_TORCH)
  return()
endif()

add_executable(torchscript_engine ${PROJECT_SOURCE_DIR}/examples/torchscript_engine.cc)
set_target_properties(torchscript_engine PROPERTIES CXX_STANDARD 17 CXX_STANDARD_REQUIRED ON
  CXX_EXTENSIONS OFF)
target_compile_options(torchscript_engine PRIVATE -Wall -Wextra -Wno-unused-parameter)
target_link_libraries(torchscript_engine PRIVATE sluice ${TORCH_LIBRARIES} PkgConfig::CRYPTO
  PkgConfig::CJSON)
