//===- Fuse.h - the fuse dialect: types and ops -----------------*- C++ -*-===//
//
// The one header for users of the fuse dialect.
//
//===----------------------------------------------------------------------===//

#ifndef TILEFUSE_DIALECT_FUSE_IR_FUSE_H
#define TILEFUSE_DIALECT_FUSE_IR_FUSE_H

#include "mlir/Bytecode/BytecodeOpInterface.h"
#include "mlir/IR/BuiltinTypes.h"
#include "mlir/IR/Dialect.h"
#include "mlir/IR/OpDefinition.h"
#include "mlir/IR/OpImplementation.h"
#include "mlir/IR/SymbolTable.h"
#include "mlir/Interfaces/ControlFlowInterfaces.h"
#include "mlir/Interfaces/SideEffectInterfaces.h"

#include "tilefuse/Dialect/Fuse/IR/FuseDialect.h.inc"
#include "tilefuse/Dialect/Fuse/IR/FuseEnums.h.inc"

#define GET_TYPEDEF_CLASSES
#include "tilefuse/Dialect/Fuse/IR/FuseTypes.h.inc"

#define GET_OP_CLASSES
#include "tilefuse/Dialect/Fuse/IR/FuseOps.h.inc"

namespace tilefuse::fuse {

/// How users and diagnostics name a kind: "full", "per-row", "per-column",
/// "scalar".
llvm::StringRef describeKind(ValueKind kind);

/// Whether a value of kind `from` can be broadcast to kind `to`
/// (scalar -> anything wider, row/col -> full).
bool canBroadcast(ValueKind from, ValueKind to);

/// The narrowest kind both `a` and `b` broadcast to (row and col join at full).
ValueKind joinKinds(ValueKind a, ValueKind b);

/// Whether `op` reduces each row: a fuse.reduce to a per-row value, a
/// fuse.arg_reduce or a merged reduction (fuse.max_sum_exp,
/// fuse.max_deviation, fuse.moments).
bool isRowReduction(mlir::Operation *op);

/// Whether every value of element type `from` is exactly representable in
/// `to`, so that a cast through `to` loses nothing.
bool isLosslessCast(mlir::Type from, mlir::Type to);

} // namespace tilefuse::fuse

#endif // TILEFUSE_DIALECT_FUSE_IR_FUSE_H
