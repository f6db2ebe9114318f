# Writes OUTPUT, a header defining MACRO (default TILEFUSE_SOURCE_HASH): the
# SHA-256 of the sources listed one per line in LIST. Cached kernels are
# keyed on the compiler's, so a changed compiler never serves kernels an
# older one compiled; torch.compile's caches on the ops' (python/).
if(NOT MACRO)
  set(MACRO TILEFUSE_SOURCE_HASH)
endif()
file(STRINGS "${LIST}" files)
set(digests "")
foreach(file IN LISTS files)
  file(SHA256 "${file}" digest)
  string(APPEND digests "${digest}\n")
endforeach()
string(SHA256 hash "${digests}")
set(content "#define ${MACRO} \"${hash}\"\n")
if(EXISTS "${OUTPUT}")
  file(READ "${OUTPUT}" old)
endif()
if(NOT old STREQUAL content)
  file(WRITE "${OUTPUT}" "${content}")
endif()
