# The self-contained libtilefuse_torch.so (-DTILEFUSE_STATIC_LLVM=ON): the
# ops, the compiler and the runtime with LLVM and MLIR linked in from the
# static archives (cmake/StaticLLVM.cmake). It needs only LibTorch, libc,
# libstdc++ and libz at run time, so `torch.ops.load_library` loads it from
# any Python with the same PyTorch release; no Python extension is built.
#
# Exported: the C++ API (tilefuse::ops, Ops.h) and nothing else, so that its
# LLVM never interposes on, or is interposed by, another LLVM in the process
# (Triton's, which torch.compile loads). The ops register themselves with
# PyTorch's dispatcher from static initializers, which need no export.
tilefuse_self_contained(tilefuse_torch ${CMAKE_CURRENT_SOURCE_DIR}/csrc/tilefuse_torch.map)
set_target_properties(tilefuse_torch PROPERTIES INSTALL_RPATH "$ORIGIN;$ORIGIN/../torch/lib")

# libdevice (the CUDA math library as LLVM bitcode, ~450 KiB) ships beside
# the library for machines without a CUDA toolkit; the compiler looks for a
# toolkit's copy first (findLibdevice in compiler/lib/Pipeline.cpp).
find_file(TILEFUSE_LIBDEVICE libdevice.10.bc
  PATHS ENV CUDA_HOME ENV CUDA_PATH /usr/local/cuda
  PATH_SUFFIXES nvvm/libdevice NO_DEFAULT_PATH)
if(TILEFUSE_LIBDEVICE)
  add_custom_command(TARGET tilefuse_torch POST_BUILD
    COMMAND ${CMAKE_COMMAND} -E copy_if_different ${TILEFUSE_LIBDEVICE}
            $<TARGET_FILE_DIR:tilefuse_torch>/libdevice.10.bc
    COMMENT "Shipping libdevice beside libtilefuse_torch.so")
  install(FILES ${TILEFUSE_LIBDEVICE} DESTINATION tilefuse)
else()
  message(WARNING "No CUDA toolkit's libdevice.10.bc was found: the "
                  "self-contained library will need one on the GPU machine")
endif()
install(TARGETS tilefuse_torch tilefuse_emulator LIBRARY DESTINATION tilefuse)
