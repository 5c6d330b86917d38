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
# clang links the C++ parts of the runtimes (UBSan's vptr and function checks, ASan's operator new
# and delete) only into programs it links as C++, and gcc's shared runtimes hold them whole. A C
# program linked by clang (test/c_api, the install test's C consumer, a user's) loads the C++
# library all the same, whose instrumented code calls those parts: it is given them, and the C++
# library they need, on its link line.
list(APPEND GRADSYNC_SANITIZE_LINK_OPTION
  "$<$<LINK_LANG_AND_ID:C,Clang>:-fsanitize-link-c++-runtime;-lstdc++>")
# Frame pointers keep the reports' stacks whole; undefined behaviour is made fatal so that a test
# fails instead of printing a warning nobody reads.
add_compile_options(-fsanitize=${gradsync_sanitize_flag} -fno-omit-frame-pointer)
add_link_options(-fsanitize=${gradsync_sanitize_flag})
if("undefined" IN_LIST gradsync_sanitizers)
  add_compile_options(-fno-sanitize-recover=undefined)
endif()
message(STATUS "gradsync: building with -fsanitize=${gradsync_sanitize_flag}")
