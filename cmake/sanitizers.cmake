# GRADSYNC_SANITIZE: "address", "undefined", "thread", or a comma list of them. Applies to every
# target defined after this file is included (the library, tests, benchmarks and examples), so
# that the code under test and the tests that drive it are instrumented alike.
if(NOT GRADSYNC_SANITIZE)
  return()
endif()

string(REPLACE "," ";" gradsync_sanitizers "${GRADSYNC_SANITIZE}")
foreach(sanitizer IN LISTS gradsync_sanitizers)
  if(NOT sanitizer MATCHES "^(address|undefined|thread)$")
    message(FATAL_ERROR "GRADSYNC_SANITIZE: unknown sanitizer '${sanitizer}'; "
                        "use address, undefined, thread, or a comma list of them")
  endif()
endforeach()
if("thread" IN_LIST gradsync_sanitizers AND "address" IN_LIST gradsync_sanitizers)
  message(FATAL_ERROR "GRADSYNC_SANITIZE: thread and address cannot be combined")
endif()

string(REPLACE ";" "," gradsync_sanitize_flag "${gradsync_sanitizers}")
# Programs that link the sanitized library (the installed package's users included) need the
# sanitizer runtimes too; bindings/ puts this flag on the gradsync target's link interface.
set(GRADSYNC_SANITIZE_LINK_OPTION -fsanitize=${gradsync_sanitize_flag})
# Frame pointers keep the reports' stacks whole; undefined behaviour is made fatal so that a test
# fails instead of printing a warning nobody reads.
add_compile_options(-fsanitize=${gradsync_sanitize_flag} -fno-omit-frame-pointer)
add_link_options(-fsanitize=${gradsync_sanitize_flag})
if("undefined" IN_LIST gradsync_sanitizers)
  add_compile_options(-fno-sanitize-recover=undefined)
endif()
message(STATUS "gradsync: building with -fsanitize=${gradsync_sanitize_flag}")
