//===- Builtins.h - the built-in fusions, written in the DSL ----*- C++ -*-===//
//
// RMSNorm (three casting modes), LayerNorm, SwiGLU, GeGLU and cross-entropy
// (forward and backward) and the AdamW step (with and without amsgrad), written with the C++ builder (Builder.h) so that LibTorch
// users get them without Python. Their inputs and outputs are those of the
// reference fusions in test/lit/fusions, which document the math.
//
//===----------------------------------------------------------------------===//

#ifndef TILEFUSE_KERNELS_BUILTINS_H
#define TILEFUSE_KERNELS_BUILTINS_H

#include "tilefuse/Compiler/Builder.h"
#include "tilefuse/Runtime/Fusion.h"

#include "mlir/IR/BuiltinOps.h"
#include "mlir/IR/OwningOpRef.h"

namespace tilefuse::kernels {

/// The names of the built-in fusions.
llvm::ArrayRef<llvm::StringRef> builtinNames();

/// Builds the built-in fusion `name`, computing in `compute` (f32, or f64
/// for float64 tensors); an unknown name is an error reported through the
/// context's diagnostics.
mlir::FailureOr<mlir::OwningOpRef<mlir::ModuleOp>>
buildBuiltin(mlir::MLIRContext &context, llvm::StringRef name,
             dsl::DType compute = dsl::DType::F32);

/// The built-in fusion `name` in the global runtime, built on first use and
/// shared afterwards (its kernels are compiled on first use per
/// specialization).
llvm::Expected<std::shared_ptr<Fusion>>
builtinFusion(llvm::StringRef name, dsl::DType compute = dsl::DType::F32);

} // namespace tilefuse::kernels

#endif // TILEFUSE_KERNELS_BUILTINS_H
