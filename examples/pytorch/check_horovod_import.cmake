# Passes when SCRIPT mentions gradsync on exactly one line, `import gradsync.torch as hvd`: with
# that line changed to `import horovod.torch as hvd` the script is a Horovod script.
# Usage: cmake -DSCRIPT=<file.py> -P check_horovod_import.cmake
if(NOT DEFINED SCRIPT)
  message(FATAL_ERROR "pass the script to check as -DSCRIPT=<file>")
endif()
file(STRINGS ${SCRIPT} mentions REGEX "[Gg][Rr][Aa][Dd][Ss][Yy][Nn][Cc]")
if(NOT mentions STREQUAL "import gradsync.torch as hvd")
  list(JOIN mentions "\n  " lines)
  if(lines STREQUAL "")
    set(lines "(none)")
  endif()
  message(FATAL_ERROR "${SCRIPT} must mention gradsync only in `import gradsync.torch as hvd`; "
                      "its lines that mention it:\n  ${lines}")
endif()
