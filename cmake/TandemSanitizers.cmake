# TANDEM_SANITIZE=address|undefined|thread. "address" also turns on
# UndefinedBehaviorSanitizer, the combination CI runs.
if(TANDEM_SANITIZE)
  if(TANDEM_SANITIZE STREQUAL "address")
    set(_san "address,undefined")
  elseif(TANDEM_SANITIZE STREQUAL "undefined")
    set(_san "undefined")
  elseif(TANDEM_SANITIZE STREQUAL "thread")
    set(_san "thread")
  else()
    message(FATAL_ERROR "TANDEM_SANITIZE must be address, undefined or thread, not '${TANDEM_SANITIZE}'")
  endif()
  add_compile_options($<$<COMPILE_LANGUAGE:CXX,C>:-fsanitize=${_san}>
                      $<$<COMPILE_LANGUAGE:CXX,C>:-fno-omit-frame-pointer>
                      $<$<COMPILE_LANGUAGE:CXX,C>:-fno-sanitize-recover=undefined>)
  add_link_options(-fsanitize=${_san})
  add_compile_definitions(TANDEM_SANITIZER_BUILD=1)
  if(TANDEM_SANITIZE STREQUAL "thread" AND CMAKE_CXX_COMPILER_ID STREQUAL "GNU")
    # GCC 12 warns that TSan does not model std::atomic_thread_fence, which
    # Asio's headers use (the frontend's HTTP server); Asio's other
    # synchronization is mutexes and atomics that TSan sees.
    add_compile_options($<$<COMPILE_LANGUAGE:CXX>:-Wno-tsan>)
  endif()
endif()
