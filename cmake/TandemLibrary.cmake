# tandem_unity_build(target): with TANDEM_UNITY_BUILD, the target's C++
# sources compile as one translation unit (libraries, service binaries and
# tests alike; frontend_unit_test opts out). Measured with GCC at -O2 -g1 on
# the 2-core VM: tandem_tokenizer's 19 files took 122 CPU-s one by one and
# 26 s as one unit, tandem_frontend's 17 (all but tool_calls.cc) 102 s
# against 19 s: each file spent most of its time on the same headers and the
# same nlohmann/json and gRPC template instances. So names at namespace
# scope, anonymous namespaces included, must not repeat within a library
# (the build says where they do). A source with its own compile options
# (cpu_ops.cc at -O2 in every build) is left out of the unit by CMake.
function(tandem_unity_build target)
  if(TANDEM_UNITY_BUILD)
    set_target_properties(${target} PROPERTIES UNITY_BUILD ON UNITY_BUILD_BATCH_SIZE 0)
  endif()
endfunction()

# tandem_cc_library(NAME name [HDRS ...] [SRCS ...] [CUDA_SRCS ...] [DEPS ...]
#                   [PUBLIC_DEFS ...])
# A library of one concept: public headers under include/tandem/<name>/,
# private sources beside them, our warnings, and an alias tandem::<name>.
function(tandem_cc_library)
  cmake_parse_arguments(T "" "NAME" "HDRS;SRCS;CUDA_SRCS;DEPS;PUBLIC_DEFS" ${ARGN})
  set(_target tandem_${T_NAME})
  set(_srcs ${T_SRCS})
  if(TANDEM_HAVE_CUDA)
    list(APPEND _srcs ${T_CUDA_SRCS})
  endif()
  if(_srcs)
    add_library(${_target} STATIC ${_srcs} ${T_HDRS})
    target_include_directories(${_target} PUBLIC ${CMAKE_CURRENT_SOURCE_DIR}/include)
    target_link_libraries(${_target} PUBLIC ${T_DEPS})
    target_compile_options(${_target} PRIVATE $<$<COMPILE_LANGUAGE:CXX>:${TANDEM_CXX_WARNINGS}>)
    target_compile_definitions(${_target} PUBLIC ${T_PUBLIC_DEFS})
    tandem_unity_build(${_target})
    if(TANDEM_HAVE_CUDA AND T_CUDA_SRCS)
      set_target_properties(${_target} PROPERTIES CUDA_SEPARABLE_COMPILATION OFF
                                                  POSITION_INDEPENDENT_CODE ON)
    endif()
  else()
    add_library(${_target} INTERFACE ${T_HDRS})
    target_include_directories(${_target} INTERFACE ${CMAKE_CURRENT_SOURCE_DIR}/include)
    target_link_libraries(${_target} INTERFACE ${T_DEPS})
    target_compile_definitions(${_target} INTERFACE ${T_PUBLIC_DEFS})
  endif()
  add_library(tandem::${T_NAME} ALIAS ${_target})
endfunction()

# tandem_cc_test(NAME name SRCS ... DEPS ... [LABELS ...] [TIMEOUT s] [SHARDS n])
# A GoogleTest binary registered with CTest. Label "unit" marks tests the
# sanitizer builds run (target unit_tests builds them all); "integration"
# marks multi-process tests. SHARDS n registers it as n CTest tests,
# name_shard0 ... name_shard<n-1>, each running every n-th case (GoogleTest's
# GTEST_TOTAL_SHARDS/GTEST_SHARD_INDEX), so that `ctest -j` runs a long
# binary on several cores: engine_core_test under TSan ran 233 s on one core
# while the other idled. tandem_test_names(VAR name) gives the CTest names.
function(tandem_cc_test)
  cmake_parse_arguments(T "" "NAME;TIMEOUT;SHARDS" "SRCS;DEPS;LABELS" ${ARGN})
  add_executable(${T_NAME} ${T_SRCS})
  target_link_libraries(${T_NAME} PRIVATE ${T_DEPS} GTest::gtest GTest::gtest_main GTest::gmock)
  target_compile_options(${T_NAME} PRIVATE ${TANDEM_CXX_WARNINGS})
  tandem_unity_build(${T_NAME})
  # A test's own code (assertions, fixtures, small references) at -O1 in the
  # optimized builds: the code it tests is the libraries', built at -O2.
  # -O2 made test files the slowest compiles of the tree (frontend_test.cc
  # 26.0 s against 20.0 s at -O1; the tests are over half the build's CPU).
  if(CMAKE_BUILD_TYPE MATCHES "^(RelWithDebInfo|Release)$" AND NOT TANDEM_FUZZ)
    target_compile_options(${T_NAME} PRIVATE $<$<COMPILE_LANGUAGE:CXX>:-O1>)
  endif()
  target_compile_definitions(${T_NAME} PRIVATE
    TANDEM_SHARED_DIR="${TANDEM_SHARED_DIR}"
    TANDEM_BINARY_DIR="${CMAKE_BINARY_DIR}"
    TANDEM_SOURCE_DIR="${CMAKE_SOURCE_DIR}")
  if(NOT T_LABELS)
    set(T_LABELS unit)
  endif()
  if(NOT T_TIMEOUT)
    set(T_TIMEOUT 600)
  endif()
  if(T_SHARDS AND T_SHARDS GREATER 1)
    math(EXPR _last "${T_SHARDS} - 1")
    foreach(_i RANGE ${_last})
      add_test(NAME ${T_NAME}_shard${_i} COMMAND ${T_NAME})
      set_tests_properties(${T_NAME}_shard${_i} PROPERTIES
        LABELS "${T_LABELS}" TIMEOUT ${T_TIMEOUT}
        ENVIRONMENT "GTEST_TOTAL_SHARDS=${T_SHARDS};GTEST_SHARD_INDEX=${_i}")
    endforeach()
  else()
    add_test(NAME ${T_NAME} COMMAND ${T_NAME})
    set_tests_properties(${T_NAME} PROPERTIES LABELS "${T_LABELS}" TIMEOUT ${T_TIMEOUT})
  endif()
  set_property(GLOBAL PROPERTY TANDEM_TEST_SHARDS_${T_NAME} "${T_SHARDS}")
  if("unit" IN_LIST T_LABELS)
    add_dependencies(unit_tests ${T_NAME})
  endif()
endfunction()

# tandem_test_names(VAR name): the CTest names of tandem_cc_test NAME name,
# for set_tests_properties (one per shard).
function(tandem_test_names var name)
  get_property(_shards GLOBAL PROPERTY TANDEM_TEST_SHARDS_${name})
  if(_shards AND _shards GREATER 1)
    math(EXPR _last "${_shards} - 1")
    set(_names "")
    foreach(_i RANGE ${_last})
      list(APPEND _names ${name}_shard${_i})
    endforeach()
    set(${var} ${_names} PARENT_SCOPE)
  else()
    set(${var} ${name} PARENT_SCOPE)
  endif()
endfunction()

# tandem_cc_binary(NAME name SRCS ... DEPS ...)
function(tandem_cc_binary)
  cmake_parse_arguments(T "" "NAME" "SRCS;DEPS" ${ARGN})
  add_executable(${T_NAME} ${T_SRCS})
  target_link_libraries(${T_NAME} PRIVATE ${T_DEPS})
  target_compile_options(${T_NAME} PRIVATE ${TANDEM_CXX_WARNINGS})
  tandem_unity_build(${T_NAME})
endfunction()
