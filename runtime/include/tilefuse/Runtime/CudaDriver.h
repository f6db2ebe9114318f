//===- CudaDriver.h - the CUDA driver API, loaded with dlopen ---*- C++ -*-===//
//
// libcuda.so.1 is opened on first GPU use, so a process with no GPU or no
// driver never needs one. Kernels (PTX, KernelABI.h) are loaded once per
// CUDA context (the driver JIT-compiles PTX for the device) and launched on
// the caller's stream. Every failure is an error naming the driver call
// and the kernel.
//
// TILEFUSE_TARGET=emulate (or emulate:sm_80, emulate:sm_90) opens the PTX
// emulator (libtilefuse_emulator.so, runtime/emulator) instead: it exports
// the same entry points, so this code is what runs against it, and host
// pointers are its device pointers.
//
//===----------------------------------------------------------------------===//

#ifndef TILEFUSE_RUNTIME_CUDADRIVER_H
#define TILEFUSE_RUNTIME_CUDADRIVER_H

#include "tilefuse/Runtime/MultiTensor.h"
#include "tilefuse/Runtime/Runtime.h"

#include "llvm/ADT/DenseMap.h"

#include <mutex>

namespace tilefuse {

/// What TILEFUSE_TARGET asks for: nothing (CPU tensors run on the CPU,
/// CUDA tensors on the GPU), "cpu" (CPU tensors only), or "emulate" /
/// "emulate:sm_80" / "emulate:sm_90" (CPU tensors run their GPU code in the
/// PTX emulator; sm_90 by default). Read once; `error` is set for any other
/// value.
struct TargetSelection {
  enum class Kind { Default, Cpu, Emulate } kind = Kind::Default;
  std::string chip; // Emulate: sm_80 or sm_90
  std::string error;
};
const TargetSelection &selectedTarget();

class CudaDriver {
public:
  /// One buffer a launch may touch, for the emulator's bounds checks and
  /// traffic counters (a real driver is not told).
  struct Buffer {
    const char *name;
    const void *base;
    uint64_t bytes;
  };

  /// Opens `library` and initializes the driver (cuInit).
  static llvm::Expected<std::unique_ptr<CudaDriver>>
  load(const std::string &library);
  /// The process's driver: libcuda.so.1, or the emulator under
  /// TILEFUSE_TARGET=emulate (the one the process has loaded, else the one
  /// beside the library holding this code, else wherever the dynamic
  /// linker finds it), opened on the first call; the error, if it could
  /// not be, on every call.
  static llvm::Expected<CudaDriver &> global();
  /// Where the emulator library is looked for first (beside the shared
  /// object that holds this code).
  static std::string emulatorPath();

  /// Whether this is the PTX emulator.
  bool emulated() const;
  ~CudaDriver();

  /// The compile target of `device`: sm_80, sm_86, sm_89 or sm_90 (any
  /// 9.x); other devices are an error.
  llvm::Expected<std::string> target(int device);

  /// The rows of the partials each column-reduction output of `kernel`
  /// needs for `rows` rows on `device`: one per block when its partials stay
  /// on chip (the block combines its row groups'), else one per row group.
  /// Loads the kernel (its grid depends on its occupancy).
  llvm::Expected<int64_t>
  partialRows(const std::shared_ptr<const GpuKernel> &kernel, int64_t rows,
              int device);

  /// Launches `kernel` over `rows` rows on `stream` of `device`, then its
  /// finalize kernel when it has column reductions. A thread with no
  /// current context gets `device`'s primary context (as the CUDA runtime
  /// would). `arguments` as CpuExecutor::run takes them (per input then
  /// output: the device pointer, or a scalar's address); `workspaces` holds
  /// one [rowGroups, n] buffer of the accumulator's dtype per
  /// column-reduction output, in output order. `extents`, when given,
  /// describes each argument then each workspace (a scalar's is ignored
  /// unless it is bound by pointer);
  /// the emulator checks each launch's accesses against the buffers it
  /// touches. The kernel stays loaded (and alive) while the process runs.
  llvm::Error launch(std::shared_ptr<const GpuKernel> kernel,
                     llvm::ArrayRef<void *> arguments,
                     llvm::ArrayRef<void *> workspaces, int64_t rows,
                     int device, void *stream,
                     llvm::ArrayRef<Buffer> extents = {});

  /// Launches `kernel`'s finalize alone: each of `workspaces` (as launch
  /// takes them) holds `partialRows` rows of partials for `rows` rows, which
  /// it reduces into the column output of the same position in
  /// `columnOutputs`. `extents`, when given, describes each workspace then
  /// each column output. launch runs it after the main kernel; the traffic
  /// benchmark runs it over a whole launch's partials.
  llvm::Error launchFinalize(std::shared_ptr<const GpuKernel> kernel,
                            llvm::ArrayRef<void *> workspaces,
                            llvm::ArrayRef<void *> columnOutputs,
                            int64_t partialRows, int64_t rows, int device,
                            void *stream,
                            llvm::ArrayRef<Buffer> extents = {});

  /// Launches a multi-tensor kernel over `call`'s tensors on `stream` of
  /// `device`: one launch per table's worth of nonempty tensors
  /// (KernelABI.h). The emulator is told every tensor's extent.
  llvm::Error launchMultiTensor(std::shared_ptr<const GpuKernel> kernel,
                                const MultiTensorCall &call, int device,
                                void *stream);

private:
  struct Api;
  struct Loaded {
    std::shared_ptr<const GpuKernel> kernel;
    void *module = nullptr, *main = nullptr, *finalize = nullptr;
    /// A persistent grid's blocks per SM: the tile's, or fewer when the
    /// driver says fewer can be resident at once (registers, shared memory).
    int64_t blocksPerSM = 0;
    /// How many of the tile's blocks one launched block holds (their row
    /// groups; foldsResidentBlocks in TileConfig.h): 1, or the blocks per
    /// SM of a folded grid, which then runs one block per SM.
    int64_t foldedBlocks = 1;
    unsigned threadsPerBlock() const {
      return kernel->info.tile.threadsPerBlock() * foldedBlocks;
    }
    unsigned sharedBytes() const {
      return kernel->info.tile.stageBytes * foldedBlocks;
    }
  };
  explicit CudaDriver(std::unique_ptr<Api> api);
  llvm::Error check(int result, llvm::StringRef call,
                    llvm::StringRef kernel = {}) const;
  /// The calling thread's current context, made `device`'s primary one
  /// when there is none.
  llvm::Expected<void *> context(int device);
  llvm::Expected<int> attribute(int device, int which);
  /// `kernel` loaded into the calling thread's current context (see
  /// context), once per context.
  llvm::Expected<Loaded>
  functions(int device, const std::shared_ptr<const GpuKernel> &kernel);
  /// JIT-compiles `ptx` (of the kernel `name`) into the current context; a
  /// failure carries the JIT's error log in full.
  llvm::Error loadModule(void **module, const std::string &ptx,
                         const std::string &name);
  /// A module loaded from `ptx` that asks the JIT for something (blocks
  /// per SM, a block size): its kernel `name`, the blocks of `threads`
  /// threads and `sharedBytes` of dynamic shared memory resident, and its
  /// local memory (spills).
  struct AskedModule {
    void *module = nullptr, *main = nullptr;
    int resident = 0, localBytes = 0;
  };
  llvm::Expected<AskedModule> loadAsking(const std::string &ptx,
                                         const std::string &name, int threads,
                                         unsigned sharedBytes);
  /// Replaces `loaded`'s module by `asked`'s.
  void keepAsked(Loaded &loaded, const AskedModule &asked);
  /// Folds the blocks of `loaded`'s persistent grid that share an SM into
  /// one block (foldsResidentBlocks): sets foldedBlocks and blocksPerSM.
  /// `plainFits`: whether a block of the plain PTX (no block size, so
  /// ptxas chose its registers freely) is resident on an SM at all.
  llvm::Error foldResidentBlocks(Loaded &loaded, bool plainFits);
  /// Where fewer blocks of `loaded`'s main kernel are resident than
  /// blocksPerSMGoal (TileConfig.h) asks for, loads its PTX again asking
  /// ptxas for that many, and where that spills, for one more block than
  /// fit; keeps the first module that spilled nothing and fits more blocks.
  /// A module that fails to load leaves the plain one (TILEFUSE_LOG=jit
  /// says why).
  llvm::Error raiseOccupancy(Loaded &loaded);
  /// The blocks a launch of `loaded` over `rows` rows takes.
  llvm::Expected<int64_t> blocks(const Loaded &loaded, int64_t rows,
                                 int device);
  /// Launches `blocks` blocks of `threads` threads with `sharedBytes` of
  /// dynamic shared memory (staged rows, TileConfig.h).
  llvm::Error launchOne(void *function, const std::string &name,
                        unsigned blocks, unsigned threads, unsigned sharedBytes,
                        void *stream, std::vector<void *> &params,
                        const std::vector<Buffer> &buffers);

  std::unique_ptr<Api> api;
  std::mutex mutex;
  llvm::DenseMap<std::pair<void *, const GpuKernel *>, Loaded> modules;
  llvm::DenseMap<std::pair<int, int>, int> attributes;
};

} // namespace tilefuse

#endif // TILEFUSE_RUNTIME_CUDADRIVER_H
