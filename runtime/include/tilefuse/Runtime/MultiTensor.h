//===- MultiTensor.h - the host side of multi-tensor calls ------*- C++ -*-===//
//
// A multi-tensor kernel (KernelABI.h) runs one elementwise fusion over many
// tensors: a call gives each tensor's element count and its columns (one
// pointer per full input, per output not written in place, per per-tensor
// scalar), and the scalars shared by all. The CPU executor runs a call as
// one parallel loop; CudaDriver as one launch per table's worth of tensors.
//
//===----------------------------------------------------------------------===//

#ifndef TILEFUSE_RUNTIME_MULTITENSOR_H
#define TILEFUSE_RUNTIME_MULTITENSOR_H

#include "tilefuse/Compiler/Pipeline.h"

#include "llvm/Support/Error.h"

#include <vector>

namespace tilefuse {

struct MultiTensorCall {
  /// Per tensor, its element count (tensors with none are skipped).
  llvm::ArrayRef<int64_t> numel;
  /// Per tensor, its multiTensorColumns(info) pointers.
  llvm::ArrayRef<void *> pointers;
  /// Per scalar input not bound per tensor, in declaration order: the
  /// address of its value (by value; float for f32, double for f64,
  /// int64_t for i64), or the pointer itself (bound by pointer).
  llvm::ArrayRef<void *> scalars;
  /// The skip flag's pointer, when the kernel has one.
  void *skipIf = nullptr;
};

/// The table columns of a multi-tensor kernel.
int64_t multiTensorColumns(const KernelInfo &info);

/// Scalar inputs a call passes in `scalars` (those not bound per tensor).
int64_t multiTensorScalars(const KernelInfo &info);

/// An error naming the kernel unless `call` fits `info`'s interface.
llvm::Error checkMultiTensorCall(const KernelInfo &info,
                                 const MultiTensorCall &call);

/// The table (KernelABI.h) of the tensors `tensors` of `call`, padded with
/// zeros to `words` words (0: no padding).
std::vector<int64_t> multiTensorTable(const MultiTensorCall &call,
                                      int64_t columns,
                                      llvm::ArrayRef<int64_t> tensors,
                                      int64_t words = 0);

} // namespace tilefuse

#endif // TILEFUSE_RUNTIME_MULTITENSOR_H
