//===- Passes.h - tilefuse compiler passes ----------------------*- C++ -*-===//

#ifndef TILEFUSE_COMPILER_PASSES_H
#define TILEFUSE_COMPILER_PASSES_H

#include "tilefuse/Dialect/Fuse/IR/Fuse.h"

#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/Dialect/GPU/IR/GPUDialect.h"
#include "mlir/Dialect/LLVMIR/LLVMDialect.h"
#include "mlir/Dialect/Math/IR/Math.h"
#include "mlir/Dialect/MemRef/IR/MemRef.h"
#include "mlir/Dialect/SCF/IR/SCF.h"
#include "mlir/Dialect/Vector/IR/VectorOps.h"
#include "mlir/IR/BuiltinOps.h"
#include "mlir/Pass/Pass.h"

namespace tilefuse {

/// Marks a lowered GPU kernel that issues loads ahead of the work that uses
/// them (fuse-lower-to-gpu); PTX generation keeps them there (Pipeline.cpp).
constexpr llvm::StringLiteral kKeepLoadOrderAttr = "tilefuse.keep_load_order";
/// An scf.for's LLVM loop metadata (fuse-lower-to-gpu sets it); the
/// conversion to control flow carries it to the loop's branch, where PTX
/// generation makes it the branch's own `loop_annotation` (Pipeline.cpp).
constexpr llvm::StringLiteral kLoopAnnotationAttr = "llvm.loop_annotation";

#define GEN_PASS_DECL
#include "tilefuse/Compiler/Passes.h.inc"

#define GEN_PASS_REGISTRATION
#include "tilefuse/Compiler/Passes.h.inc"

} // namespace tilefuse

#endif // TILEFUSE_COMPILER_PASSES_H
