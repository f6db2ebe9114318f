# tilefuse_hash_sources(TARGET target HEADER path MACRO name SOURCES files...)
# adds to `target` a generated header at `path` defining `name`: the
# SHA-256 of `files` (cmake/SourceHash.cmake), rewritten when one changes.
function(tilefuse_hash_sources)
  cmake_parse_arguments(ARG "" "TARGET;HEADER;MACRO" "SOURCES" ${ARGN})
  list(SORT ARG_SOURCES)
  string(REPLACE ";" "\n" lines "${ARG_SOURCES}")
  set(list_file ${CMAKE_CURRENT_BINARY_DIR}/${ARG_MACRO}.sources.txt)
  file(WRITE ${list_file} "${lines}\n")
  add_custom_command(
    OUTPUT ${ARG_HEADER}
    COMMAND ${CMAKE_COMMAND} -DLIST=${list_file} -DOUTPUT=${ARG_HEADER}
            -DMACRO=${ARG_MACRO} -P ${TILEFUSE_SOURCE_DIR}/cmake/SourceHash.cmake
    DEPENDS ${ARG_SOURCES} ${TILEFUSE_SOURCE_DIR}/cmake/SourceHash.cmake
    COMMENT "Hashing the sources behind ${ARG_MACRO}")
  target_sources(${ARG_TARGET} PRIVATE ${ARG_HEADER})
endfunction()
