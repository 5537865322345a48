# test_remote_hf starts the tests' stand-in for the Hugging Face Hub and its
# storage (hf_hub_server.py, python3); it skips (77) when it cannot.
# and a look-alike host of the Hub's endpoint (remote_fault_server.py).
target_compile_definitions(test_remote_hf PRIVATE
  SLUICE_HF_SERVER="${CMAKE_CURRENT_SOURCE_DIR}/hf_hub_server.py"
  SLUICE_FAULT_SERVER="${CMAKE_CURRENT_SOURCE_DIR}/remote_fault_server.py")
set_tests_properties(test_remote_hf PROPERTIES LABELS "remote" TIMEOUT 120)
