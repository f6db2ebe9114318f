//===- PredicatedLoad.h - PTX loads that move no bytes when off -*- C++ -*-===//
//
// Private to the compiler library: the column-reduction kernels' vectors
// past a row's end and rows past the launch's, a gathered element only the
// row's leader needs, and the finalize's partial rows past a thread's
// share load through this.
//
//===----------------------------------------------------------------------===//

#ifndef TILEFUSE_COMPILER_LIB_PREDICATEDLOAD_H
#define TILEFUSE_COMPILER_LIB_PREDICATEDLOAD_H

#include "mlir/IR/Builders.h"

namespace tilefuse {

/// A GPU load of `otherwise`'s type (a scalar of 8, 16, 32 or 64 bits, or
/// a vector) from `base` + `byteOffset`, aligned to `alignment` bytes, where
/// `predicate` holds, else `otherwise`: predicated `ld.global`s (inline
/// PTX), which move no bytes when the predicate is off, where a load of a
/// clamped address would. LLVM has no predicated load (its masked loads
/// become branches, which ptxas does not move loads across). LLVM sees
/// inline assembly, not a load: with `mayMerge` it may merge two with the
/// same operands or hoist one out of a loop (never for memory the kernel
/// writes before reading it again); without, each stays where it is
/// emitted, as the row programs need (merged re-reads of a streamed row
/// kept it in registers, and ptxas spilled).
mlir::Value predicatedLoad(mlir::OpBuilder &b, mlir::Location loc,
                           mlir::Value base, int64_t byteOffset,
                           mlir::Value predicate, mlir::Value otherwise,
                           unsigned alignment, bool mayMerge);

} // namespace tilefuse

#endif // TILEFUSE_COMPILER_LIB_PREDICATEDLOAD_H
