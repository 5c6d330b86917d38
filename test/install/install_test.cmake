# Installs the built tree into a scratch prefix, then builds projects against it with
# find_package(gradsync), as trainers' own builds would: one that enables C and C++, one that
# enables C++ alone (as most C++ projects do), one that enables C alone (using the C API), and,
# when the package has the libtorch adapter, a libtorch trainer. Each runs on two ranks.
# Inputs: BUILD_DIR, CONSUMERS_DIR, WORK_DIR, MPIEXEC, and C_COMPILER and CXX_COMPILER, the
# build's compilers, which the consumers are built with.
function(run)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "failed (${rc}): ${ARGN}")
  endif()
endfunction()

# The consumers are built as users' projects are, without the test programs' sanitizer helpers
# (test/sanitizers/asan_keep_plugins.c): under AddressSanitizer their leak reports reach the frames
# that the suppressions match only when each allocation's stack is unwound in full. ASan reads its
# options in order, so the appended one wins; outside a sanitized run nothing reads it.
if(DEFINED ENV{ASAN_OPTIONS})
  set(ENV{ASAN_OPTIONS} "$ENV{ASAN_OPTIONS}:fast_unwind_on_malloc=0")
endif()

file(REMOVE_RECURSE ${WORK_DIR})
run(${CMAKE_COMMAND} --install ${BUILD_DIR} --prefix ${WORK_DIR}/prefix)
set(consumers consumer_c_cxx consumer_cxx consumer_c)
# The libtorch adapter's consumer, when the package has it.
if(EXISTS ${WORK_DIR}/prefix/lib/cmake/gradsync/gradsyncTorchTargets.cmake OR
   EXISTS ${WORK_DIR}/prefix/lib64/cmake/gradsync/gradsyncTorchTargets.cmake)
  list(APPEND consumers consumer_torch)
endif()
foreach(consumer ${consumers})
  set(build ${WORK_DIR}/${consumer})
  run(${CMAKE_COMMAND} -S ${CONSUMERS_DIR}/${consumer} -B ${build}
      -DCMAKE_PREFIX_PATH=${WORK_DIR}/prefix -DCMAKE_C_COMPILER=${C_COMPILER}
      -DCMAKE_CXX_COMPILER=${CXX_COMPILER})
  run(${CMAKE_COMMAND} --build ${build})
  run(${MPIEXEC} -np 2 --oversubscribe ${build}/consumer)
endforeach()
