# `sluice serve`: the gRPC tensor service (tools/serve/serve.cc), its proto
# (proto/sluice/v1/tensor_service.proto) and the C++ client example
# (examples/serve_client.cc). Optional: built when Debian's libgrpc++-dev,
# libprotobuf-dev and protobuf-compiler-grpc are found (SLUICE_WITH_GRPC,
# on by default). The library itself has no gRPC dependency: the server
# uses its public API only.
set(SLUICE_HAVE_GRPC OFF)
if(SLUICE_WITH_GRPC)
  pkg_check_modules(GRPCPP QUIET IMPORTED_TARGET grpc++)
  pkg_check_modules(PROTOBUF QUIET IMPORTED_TARGET protobuf)
  find_program(SLUICE_PROTOC protoc)
  find_program(SLUICE_GRPC_CPP_PLUGIN grpc_cpp_plugin)
  if(GRPCPP_FOUND AND PROTOBUF_FOUND AND SLUICE_PROTOC AND SLUICE_GRPC_CPP_PLUGIN)
    set(SLUICE_HAVE_GRPC ON)
  else()
    message(STATUS "grpc++ not found (apt-get install -y libgrpc++-dev libprotobuf-dev "
                   "protobuf-compiler protobuf-compiler-grpc): no sluice serve")
  endif()
endif()
message(STATUS "sluice serve (gRPC): ${SLUICE_HAVE_GRPC}")
if(NOT SLUICE_HAVE_GRPC)
  return()
endif()

enable_language(CXX)
set(CMAKE_CXX_STANDARD 17)
set(CMAKE_CXX_STANDARD_REQUIRED ON)
set(CMAKE_CXX_EXTENSIONS OFF)

set(SLUICE_PROTO ${PROJECT_SOURCE_DIR}/proto/sluice/v1/tensor_service.proto)
set(SLUICE_PROTO_OUT ${PROJECT_BINARY_DIR}/generated/proto)
set(SLUICE_PROTO_SRCS ${SLUICE_PROTO_OUT}/tensor_service.pb.cc ${SLUICE_PROTO_OUT}/tensor_service.grpc.pb.cc)
add_custom_command(
  OUTPUT ${SLUICE_PROTO_SRCS} ${SLUICE_PROTO_OUT}/tensor_service.pb.h ${SLUICE_PROTO_OUT}/tensor_service.grpc.pb.h
  COMMAND ${CMAKE_COMMAND} -E make_directory ${SLUICE_PROTO_OUT}
  COMMAND ${SLUICE_PROTOC} -I ${PROJECT_SOURCE_DIR}/proto/sluice/v1
          --cpp_out=${SLUICE_PROTO_OUT} --grpc_out=${SLUICE_PROTO_OUT}
          --plugin=protoc-gen-grpc=${SLUICE_GRPC_CPP_PLUGIN} ${SLUICE_PROTO}
  DEPENDS ${SLUICE_PROTO}
  COMMENT "protoc: tensor_service.proto")

# The generated code, compiled once for the server and the client example.
add_library(sluice_proto STATIC ${SLUICE_PROTO_SRCS})
target_include_directories(sluice_proto PUBLIC ${SLUICE_PROTO_OUT})
target_link_libraries(sluice_proto PUBLIC PkgConfig::GRPCPP PkgConfig::PROTOBUF)

# relay.cc: the TCP and TLS front (libssl), no gRPC header in it.
pkg_check_modules(LIBSSL REQUIRED IMPORTED_TARGET libssl)
add_executable(sluice_serve ${PROJECT_SOURCE_DIR}/tools/serve/serve.cc
  ${PROJECT_SOURCE_DIR}/tools/serve/relay.cc ${PROJECT_SOURCE_DIR}/tools/exit.c)
set_target_properties(sluice_serve PROPERTIES OUTPUT_NAME sluice-serve
  INSTALL_RPATH "$ORIGIN/../${CMAKE_INSTALL_LIBDIR}")
target_compile_options(sluice_serve PRIVATE -Wall -Wextra -Wno-unused-parameter)
target_link_libraries(sluice_serve PRIVATE sluice sluice_proto PkgConfig::LIBSSL PkgConfig::CRYPTO
  Threads::Threads)
install(TARGETS sluice_serve RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})

add_executable(serve_client ${PROJECT_SOURCE_DIR}/examples/serve_client.cc)
target_compile_options(serve_client PRIVATE -Wall -Wextra -Wno-unused-parameter)
target_link_libraries(serve_client PRIVATE sluice sluice_proto PkgConfig::CRYPTO PkgConfig::CJSON
  Threads::Threads)
# /metrics of the server: libmicrohttpd, as the library's endpoint.
if(SLUICE_HAVE_MICROHTTPD)
  target_compile_definitions(sluice_serve PRIVATE SLUICE_SERVE_HAVE_MHD)
  target_link_libraries(sluice_serve PRIVATE PkgConfig::MHD)
endif()
