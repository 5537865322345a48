# test_digest exercises the command's own parallel hashing (tools/digest.c)
# in-process, where a file can be cut or removed between open and hashing.
target_sources(test_digest PRIVATE ${PROJECT_SOURCE_DIR}/tools/digest.c
  ${PROJECT_SOURCE_DIR}/tools/progress.c)
target_include_directories(test_digest PRIVATE ${PROJECT_SOURCE_DIR}/tools)
