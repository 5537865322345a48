# ctest torchscript_engine (tests/torchscript/engine_test.py): the C++
# libtorch engine example runs TorchScript blocks exported without weights
# with weights sluice reads on demand; equal to eager torch, failures
# before the block, a bad plan before any block, RSS within the pool. Only
# when the engine is built (CMake found Torch); skips without python3-torch.
if(SLUICE_BUILD_TOOLS AND SLUICE_HAVE_TORCH)
  add_test(NAME torchscript_engine
    COMMAND /usr/bin/python3 ${CMAKE_CURRENT_SOURCE_DIR}/torchscript/engine_test.py
            $<TARGET_FILE:torchscript_engine> $<TARGET_FILE:sluice_cli> ${PROJECT_SOURCE_DIR})
  set_tests_properties(torchscript_engine PROPERTIES TIMEOUT 600 SKIP_RETURN_CODE 77)
endif()
