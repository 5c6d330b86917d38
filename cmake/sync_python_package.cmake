# Run as `cmake -DSOURCE=<dir> -DDESTINATION=<dir> -P sync_python_package.cmake`: copies the
# package's Python sources into the build tree and removes the Python files there that the source
# no longer has (with their folder, where the source has none), so that a module deleted or
# renamed in the source cannot still be imported from the build tree. Built files (the extension
# module) are left alone.
file(GLOB_RECURSE built RELATIVE ${DESTINATION} ${DESTINATION}/*.py)
foreach(relative IN LISTS built)
  if(NOT EXISTS ${SOURCE}/${relative})
    # The outermost folder the source lacks goes whole; else the file alone.
    set(stale ${relative})
    get_filename_component(folder ${relative} DIRECTORY)
    while(folder AND NOT EXISTS ${SOURCE}/${folder})
      set(stale ${folder})
      get_filename_component(folder ${folder} DIRECTORY)
    endwhile()
    file(REMOVE_RECURSE ${DESTINATION}/${stale})
  endif()
endforeach()
file(COPY ${SOURCE}/ DESTINATION ${DESTINATION})
