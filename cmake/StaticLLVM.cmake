# The self-contained build (-DTILEFUSE_STATIC_LLVM=ON): the MLIR and LLVM
# components tilefuse uses, from Debian's static archives (all PIC).
#
# Debian builds LLVM with LLVM_LINK_LLVM_DYLIB, so its imported static MLIR
# targets name the shared libLLVM.so as their LLVM dependency. Linking that
# next to the static archives would put two copies of LLVM's global state
# (command-line options, target registry) in one process: every imported
# MLIR target reachable from the libraries we use is pointed at LLVM's
# static component archives instead.

# The MLIR libraries compile() and the runtime reach (dialects, the passes
# registerPipelinePasses names, translation to LLVM IR, the ORC JIT).
set(TILEFUSE_STATIC_MLIR_LIBRARIES
  MLIRIR MLIRSupport MLIRParser MLIRPass MLIRTransforms MLIRTransformUtils
  MLIRArithDialect MLIRMathDialect MLIRMathTransforms MLIRVectorDialect
  MLIRSCFDialect MLIRMemRefDialect MLIRFuncDialect MLIRControlFlowDialect
  MLIRIndexDialect MLIRUBDialect MLIRGPUDialect MLIRLLVMDialect MLIRNVVMDialect
  MLIRArithToLLVM MLIRControlFlowToLLVM MLIRFuncToLLVM MLIRGPUToNVVMTransforms
  MLIRIndexToLLVM MLIRMathToLLVM MLIRMathToLibm MLIRMemRefToLLVM
  MLIRNVVMToLLVM MLIRUBToLLVM MLIRVectorToLLVM MLIRSCFToControlFlow
  MLIRReconcileUnrealizedCasts MLIRConvertToLLVMPass
  MLIRBuiltinToLLVMIRTranslation MLIRGPUToLLVMIRTranslation
  MLIRLLVMToLLVMIRTranslation MLIRNVVMToLLVMIRTranslation
  MLIRTargetLLVMIRExport MLIRNVVMTarget
  MLIRExecutionEngine MLIRExecutionEngineUtils)

# The LLVM components those MLIR libraries and tilefuse's own code need:
# the NVPTX backend, the host backend and ORC for the CPU JIT, the O3
# pipeline, bitcode reading and linking (libdevice), textual IR (the disk
# cache keeps CPU kernels as LLVM IR); MLIR's ExecutionEngine references
# the perf JIT listener.
set(TILEFUSE_STATIC_LLVM_COMPONENTS
  Core Support Analysis TransformUtils Passes Linker BitReader BitWriter
  AsmParser IRReader MC Target TargetParser FrontendOpenMP FrontendOffloading
  OrcJIT ExecutionEngine JITLink PerfJITEvents NVPTX native)

# LLVMSupport's link interface names these (compression), and a shared
# LLVM build never looks them up.
find_package(ZLIB REQUIRED)
find_package(zstd REQUIRED)

# Sets `out` to the libraries a target links for the static build.
function(tilefuse_static_llvm_libraries out)
  llvm_map_components_to_libnames(llvm_libraries ${TILEFUSE_STATIC_LLVM_COMPONENTS})
  set(pending ${TILEFUSE_STATIC_MLIR_LIBRARIES})
  set(visited)
  while(pending)
    list(POP_FRONT pending library)
    if(library IN_LIST visited OR NOT TARGET ${library})
      continue()
    endif()
    list(APPEND visited ${library})
    get_target_property(dependencies ${library} INTERFACE_LINK_LIBRARIES)
    if(NOT dependencies)
      continue()
    endif()
    # MLIRExecutionEngine also names the shared libMLIR.so whole: it gets
    # the MLIR libraries above instead.
    if("LLVM" IN_LIST dependencies OR "MLIR" IN_LIST dependencies)
      if("MLIR" IN_LIST dependencies)
        set(mlir_libraries ${TILEFUSE_STATIC_MLIR_LIBRARIES})
        list(REMOVE_ITEM mlir_libraries ${library})
        list(APPEND dependencies ${mlir_libraries})
      endif()
      list(REMOVE_ITEM dependencies LLVM MLIR)
      list(APPEND dependencies ${llvm_libraries})
      set_target_properties(${library} PROPERTIES INTERFACE_LINK_LIBRARIES "${dependencies}")
    endif()
    list(APPEND pending ${dependencies})
  endwhile()
  set(${out} ${TILEFUSE_STATIC_MLIR_LIBRARIES} ${llvm_libraries} PARENT_SCOPE)
endfunction()

# Makes the shared library `target` self-contained: built into lib/ (where
# the bundle is packed from), exporting only what `version_script` lists,
# unused sections dropped, no undefined symbol left, stripped.
function(tilefuse_self_contained target version_script)
  set_target_properties(${target} PROPERTIES
    LINK_DEPENDS ${version_script}
    LIBRARY_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/lib)
  target_link_options(${target} PRIVATE
    -Wl,--version-script=${version_script}
    -Wl,--gc-sections -Wl,--as-needed -Wl,-z,defs -Wl,--strip-all)
endfunction()
