//===- EmitPTX.h - LLVM dialect kernels to PTX text -------------*- C++ -*-===//
//
// Private to the compiler library: the last step of the PTX pipeline, from
// the gpu.module in the LLVM and NVVM dialects to PTX through LLVM's NVPTX
// backend.
//
//===----------------------------------------------------------------------===//

#ifndef TILEFUSE_COMPILER_LIB_EMITPTX_H
#define TILEFUSE_COMPILER_LIB_EMITPTX_H

#include "tilefuse/Compiler/Pipeline.h"

#include <chrono>
#include <string>

namespace tilefuse {

using Clock = std::chrono::steady_clock;

inline double millisecondsBetween(Clock::time_point start,
                                  Clock::time_point end) {
  return std::chrono::duration<double, std::milli>(end - start).count();
}

inline double millisecondsSince(Clock::time_point start) {
  return millisecondsBetween(start, Clock::now());
}

/// Translates the gpu.module of `module` to LLVM IR (one module per
/// kernel), links the libdevice functions it calls, optimizes it and
/// generates PTX into `result.text` (the optimized LLVM IR when `stop` is
/// Stage::LLVM, and into `optimizedIR` when given). Times "llvm-ir" up to
/// the first kernel's module optimized and "ptx" from there to the joined
/// PTX (which includes the other kernels' work where it did not overlap).
mlir::LogicalResult emitPTX(mlir::ModuleOp module,
                            const CompileOptions &options, Stage stop,
                            CompileResult &result, std::string *optimizedIR);

} // namespace tilefuse

#endif // TILEFUSE_COMPILER_LIB_EMITPTX_H
