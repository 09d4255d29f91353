# tandem_proto_library(NAME name PROTOS ... [GRPC])
# Generates C++ (and gRPC stubs) for the given .proto files into one target.
# Generated code is third-party code to us: no -Werror on it.
function(tandem_proto_library)
  cmake_parse_arguments(T "" "NAME;ROOT" "PROTOS" ${ARGN})
  set(_out ${CMAKE_CURRENT_BINARY_DIR}/gen)
  file(MAKE_DIRECTORY ${_out})
  find_program(_grpc_cpp_plugin grpc_cpp_plugin REQUIRED)
  set(_srcs)
  foreach(_proto ${T_PROTOS})
    file(RELATIVE_PATH _rel ${T_ROOT} ${_proto})
    string(REGEX REPLACE "\\.proto$" "" _base ${_rel})
    set(_gen ${_out}/${_base}.pb.cc ${_out}/${_base}.pb.h
             ${_out}/${_base}.grpc.pb.cc ${_out}/${_base}.grpc.pb.h)
    add_custom_command(
      OUTPUT ${_gen}
      COMMAND protobuf::protoc
        --proto_path=${T_ROOT}
        --cpp_out=${_out}
        --grpc_out=${_out}
        --plugin=protoc-gen-grpc=${_grpc_cpp_plugin}
        ${_proto}
      DEPENDS ${_proto} protobuf::protoc
      COMMENT "protoc ${_rel}"
      VERBATIM)
    list(APPEND _srcs ${_out}/${_base}.pb.cc ${_out}/${_base}.grpc.pb.cc)
  endforeach()
  add_library(${T_NAME} STATIC ${_srcs})
  target_include_directories(${T_NAME} SYSTEM PUBLIC ${_out})
  target_link_libraries(${T_NAME} PUBLIC protobuf::libprotobuf gRPC::grpc++)
endfunction()
