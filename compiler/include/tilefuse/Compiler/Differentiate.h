//===- Differentiate.h - reverse-mode AD of fuse kernels --------*- C++ -*-===//
//
// differentiate() derives, from a forward kernel and the outputs that get a
// gradient, one backward kernel computing the gradients of chosen inputs.
// Adjoints: PyTorch's derivative formulas for every elementwise op
// (maximum/minimum split ties in half; floor and round have none); a row
// reduction's adjoint is a broadcast, a broadcast's a row or column
// reduction; gather's a one-hot within the row; a row max or min sends its
// gradient to the row's argmax/argmin, the first extreme element, as
// torch.max(x, dim) does (torch.amax splits it among ties; the two agree
// wherever the extreme is unique).
//
// What the backward reads, and what it recomputes:
//   - the forward's inputs; every full, per-column and scalar value is
//     recomputed from them, so no [rows, n] intermediate is ever stored;
//   - per-row statistics: a per-row value that depends on a row reduction
//     (rstd, mean, lse, a row max) is saved by the forward and read back,
//     since recomputing it would take another pass over the row. The
//     derived forward outputs the ones it does not output already (a row
//     max or min whose adjoint is needed also outputs its argmax/argmin);
//   - other per-row values (gathers, per-row inputs) are recomputed.
// A row sum the backward needs is split over sums, differences and per-row
// factors when that removes a reduction level or a reduction, and a sum the
// forward already took (a sum or mean it reduced) is read from its saved
// statistic: derived cross-entropy backward reduces nothing, LayerNorm's
// reduces twice in one pass, as the hand-written kernels do.
//
// The backward kernel's inputs are the gradient `d<output>` of each chosen
// output, the forward inputs it reads (same names), then the saved
// statistics (named as the forward's output, else `rowmax`, `argmax`, ...);
// its outputs are `d<input>` for each chosen input, in the input's type (a
// per-column input's gradient is a column reduction). Names that would clash
// get a `grad_` prefix or a number.
//
//===----------------------------------------------------------------------===//

#ifndef TILEFUSE_COMPILER_DIFFERENTIATE_H
#define TILEFUSE_COMPILER_DIFFERENTIATE_H

#include "tilefuse/Dialect/Fuse/IR/Fuse.h"

#include "mlir/IR/Builders.h"

#include <string>

namespace tilefuse {

struct DifferentiateOptions {
  /// The outputs given a gradient; empty: every float output.
  llvm::SmallVector<std::string> outputs;
  /// The inputs whose gradients the backward computes; empty: every full,
  /// per-row and per-column float input.
  llvm::SmallVector<std::string> inputs;
  /// The backward kernel's name; empty: `<name>_bwd`, with a trailing
  /// `_fwd` dropped.
  std::string backwardName;
};

struct Derivative {
  /// The forward kernel with the saved statistics appended to its outputs.
  fuse::KernelOp forward;
  fuse::KernelOp backward;
  /// Where each backward input comes from: the gradient of an output, an
  /// input of the forward, or an output of the derived forward (a saved
  /// statistic); `index` counts within that list.
  struct Source {
    enum Kind { OutputGradient, Input, ForwardOutput };
    Kind kind;
    unsigned index;
  };
  llvm::SmallVector<Source> backwardInputs;
  /// The forward input each backward output is the gradient of.
  llvm::SmallVector<unsigned> gradientOf;
};

/// Builds the derived forward and the backward kernel of `kernel` at
/// `builder`'s insertion point (`kernel` itself is not changed). Errors
/// (an unknown name, an integer output, a column mean or max to
/// differentiate) are emitted on `kernel` and return failure.
mlir::FailureOr<Derivative> differentiate(fuse::KernelOp kernel,
                                          const DifferentiateOptions &options,
                                          mlir::OpBuilder &builder);

/// Keeps the outputs of a backward kernel flagged in `keep` (one flag per
/// output) and removes the work only the others needed.
mlir::LogicalResult keepGradients(fuse::KernelOp backward,
                                  llvm::ArrayRef<bool> keep);

} // namespace tilefuse

#endif // TILEFUSE_COMPILER_DIFFERENTIATE_H
