//===- CpuExecutor.h - run CPU kernels with rows split over threads -*- C++ -*-===//
//
// Runs a fusion compiled for the CPU target (KernelABI.h): rows are cut into
// tasks of `rows_per_task` rows, run on a thread pool; column reductions
// accumulate into one partials row per group of at most kCpuRowsPerPartial
// rows; then the finalize function combines the partials in group order, so
// results do not depend on the thread count or on scheduling.
//
//===----------------------------------------------------------------------===//

#ifndef TILEFUSE_RUNTIME_CPUEXECUTOR_H
#define TILEFUSE_RUNTIME_CPUEXECUTOR_H

#include "tilefuse/Runtime/MultiTensor.h"

#include "llvm/Support/Error.h"
#include "llvm/Support/ThreadPool.h"

namespace tilefuse {

class CpuExecutor {
public:
  /// `threads` workers; 0 means one per hardware thread.
  explicit CpuExecutor(unsigned threads = 0);

  /// A JIT-compiled function in the ExecutionEngine's packed form.
  using PackedFunction = void (*)(void **);

  /// Runs `info`'s `kernel` (and `finalize`, for column reductions) over
  /// `rows` rows. `arguments` holds one entry per input then per output, in
  /// declaration order: the address of the tensor's data, or for a scalar
  /// input the address of its value (float for f32, double for f64,
  /// int64_t for i64), or the pointer itself for a scalar bound by pointer.
  llvm::Error run(const KernelInfo &info, PackedFunction kernel,
                  PackedFunction finalize, llvm::ArrayRef<void *> arguments,
                  int64_t rows);

  /// Runs a multi-tensor kernel over `call`'s tensors as one parallel loop
  /// over tasks of rows_per_task consecutive elements.
  llvm::Error runMultiTensor(const KernelInfo &info, PackedFunction kernel,
                             const MultiTensorCall &call);

private:
  /// Runs runTask(0) ... runTask(tasks - 1) on the pool and waits.
  template <typename Task> void runTasks(int64_t tasks, Task runTask);

  llvm::StdThreadPool pool;
};

} // namespace tilefuse

#endif // TILEFUSE_RUNTIME_CPUEXECUTOR_H
