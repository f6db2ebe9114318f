# Writes OUTPUT, a header defining TILEFUSE_SOURCE_HASH: the SHA-256 of the
# compiler's sources (listed one per line in LIST). Cached kernels are keyed
# on it, so a changed compiler never serves kernels an older one compiled.
file(STRINGS "${LIST}" files)
set(digests "")
foreach(file IN LISTS files)
  file(SHA256 "${file}" digest)
  string(APPEND digests "${digest}\n")
endforeach()
string(SHA256 hash "${digests}")
set(content "#define TILEFUSE_SOURCE_HASH \"${hash}\"\n")
if(EXISTS "${OUTPUT}")
  file(READ "${OUTPUT}" old)
endif()
if(NOT old STREQUAL content)
  file(WRITE "${OUTPUT}" "${content}")
endif()
