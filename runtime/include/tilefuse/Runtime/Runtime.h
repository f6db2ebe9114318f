//===- Runtime.h - compile on first use, cached, then run -------*- C++ -*-===//
//
// The process-wide runtime: one MLIRContext, the kernel cache, the CPU
// executor. getKernel() turns a fusion and its specialization into a loaded
// kernel: from memory, else from the disk cache (no recompilation), else by
// compiling. Nothing that changes per call (rows, scalars, pointers) is part
// of the key, so new batch sizes and learning rates never recompile.
//
//===----------------------------------------------------------------------===//

#ifndef TILEFUSE_RUNTIME_RUNTIME_H
#define TILEFUSE_RUNTIME_RUNTIME_H

#include "tilefuse/Compiler/Pipeline.h"
#include "tilefuse/Runtime/CpuExecutor.h"
#include "tilefuse/Runtime/KernelCache.h"

#include "mlir/IR/Diagnostics.h"
#include "mlir/IR/MLIRContext.h"

namespace tilefuse {

/// A kernel ready to run on the CPU, its entry points resolved once.
class CpuKernel {
public:
  /// Fails if `engine` lacks the kernel's (or its finalize) function.
  static llvm::Expected<std::shared_ptr<const CpuKernel>>
  create(KernelInfo info, std::unique_ptr<mlir::ExecutionEngine> engine);
  ~CpuKernel();
  const KernelInfo &info() const { return kernelInfo; }
  /// Runs over `rows` rows (see CpuExecutor::run for `arguments`).
  llvm::Error run(CpuExecutor &executor, llvm::ArrayRef<void *> arguments,
                  int64_t rows) const;
  /// Runs a multi-tensor kernel over `call`'s tensors.
  llvm::Error runMultiTensor(CpuExecutor &executor,
                             const MultiTensorCall &call) const;

private:
  CpuKernel(KernelInfo info, std::unique_ptr<mlir::ExecutionEngine> engine);

  KernelInfo kernelInfo;
  std::unique_ptr<mlir::ExecutionEngine> engine;
  CpuExecutor::PackedFunction kernel = nullptr;
  CpuExecutor::PackedFunction finalize = nullptr;
};

/// Kernel launches this process made: CPU kernel runs (one parallel loop
/// each) and GPU launches (a column reduction's finalize counts too).
int64_t kernelLaunches();
void countKernelLaunch();

/// A kernel compiled for a GPU: its interface and PTX. The CUDA driver
/// loads and launches it (python/tilefuse/_cuda.py; KernelABI.h).
struct GpuKernel {
  KernelInfo info;
  std::string ptx;
};

/// The on-disk form of a compiled kernel: its interface, then its code
/// (LLVM IR for the CPU, PTX for a GPU).
std::string serializeArtifact(const KernelInfo &info, llvm::StringRef code);
llvm::Expected<std::pair<KernelInfo, std::string>>
deserializeArtifact(llvm::StringRef artifact);

/// Collects the diagnostics emitted in `context` while it lives, to return
/// as an error.
struct DiagnosticCollector {
  explicit DiagnosticCollector(mlir::MLIRContext &context)
      : handler(&context, [this](mlir::Diagnostic &diagnostic) {
          if (!messages.empty())
            messages += "\n";
          messages += diagnostic.str();
          return mlir::success();
        }) {}
  llvm::Error error(llvm::StringRef context) const {
    return llvm::createStringError(context + ": " + messages);
  }
  std::string messages;
  mlir::ScopedDiagnosticHandler handler;
};

/// Tile overrides of one kernel (CompileOptions' fields; 0 / "auto" keep
/// the heuristic's choice).
struct TileOverride {
  int64_t threadsPerRow = 0, rowsPerBlock = 0, vectorWidth = 0;
  std::string rowOnChip = "auto";
};

/// Parses TILEFUSE_TILE: `KERNEL:KEY=VALUE[,KEY=VALUE...]` entries joined by
/// ';', the keys tilefuse-compile's overrides (threads-per-row,
/// rows-per-block, vector-width, row-on-chip=true|false|auto). For
/// experiments: a benchmark times a tile the heuristic did not choose
/// (benchmarks/gpu_kernel_times.py --variant); fuse-select-tiles checks
/// the values.
llvm::Expected<llvm::StringMap<TileOverride>>
parseTileOverrides(llvm::StringRef text);

class Runtime {
public:
  /// A runtime caching in `cacheDirectory` (std::nullopt: memory only).
  explicit Runtime(std::optional<std::string> cacheDirectory);
  ~Runtime();

  /// The process's runtime: $TILEFUSE_CACHE_DIR (or ~/.cache/tilefuse);
  /// TILEFUSE_ALWAYS_COMPILE=1 bypasses every cache; TILEFUSE_LOG=compile
  /// prints one line per compilation (kernel, key, time) to stderr;
  /// TILEFUSE_DUMP=<dir> writes every stage of every compilation there;
  /// TILEFUSE_TILE overrides kernels' tiles (parseTileOverrides).
  static Runtime &global();

  mlir::MLIRContext &context() { return mlirContext; }
  CpuExecutor &executor() { return cpuExecutor; }
  KernelCache &cache() { return *kernelCache; }

  /// The CPU kernel for the fusion in `module` specialized by `options`
  /// (options.target must be "cpu"). `module` is not modified.
  llvm::Expected<std::shared_ptr<const CpuKernel>>
  getCpuKernel(mlir::ModuleOp module, const CompileOptions &options);

  /// The PTX of the fusion in `module` specialized by `options`
  /// (options.target: sm_80, sm_86, sm_89 or sm_90), from the same caches.
  llvm::Expected<std::shared_ptr<const GpuKernel>>
  getGpuKernel(mlir::ModuleOp module, const CompileOptions &options);

  /// TILEFUSE_ALWAYS_COMPILE=1: no cache, in memory or on disk, is used.
  bool alwaysCompiles() const { return alwaysCompile; }

  /// Compilations this runtime ran (not counting cache hits).
  int64_t compileCount() const { return compiles.load(); }

private:
  /// `options` with the TILEFUSE_TILE override of the module's kernel, or
  /// nothing where none applies (no copy on the per-call path).
  llvm::Expected<std::optional<CompileOptions>>
  tileOverride(mlir::ModuleOp module, const CompileOptions &options) const;
  CacheKey keyFor(mlir::ModuleOp module, const CompileOptions &options);
  llvm::Expected<std::pair<KernelInfo, std::string>>
  artifactFor(mlir::ModuleOp module, const CompileOptions &options,
              const CacheKey &key);

  mlir::MLIRContext mlirContext;
  CpuExecutor cpuExecutor;
  std::unique_ptr<KernelCache> kernelCache;
  bool alwaysCompile = false;
  bool logCompiles = false;
  std::string dumpDirectory;
  /// TILEFUSE_TILE, parsed: each kernel's overrides, or why it is
  /// malformed (every compilation then fails with that message).
  llvm::StringMap<TileOverride> tileOverrides;
  std::string tileOverrideError;
  std::atomic<int64_t> compiles{0};
  std::mutex loadedMutex;
  llvm::StringMap<std::shared_ptr<const CpuKernel>> loaded;
  llvm::StringMap<std::shared_ptr<const GpuKernel>> loadedGpu;
};

} // namespace tilefuse

#endif // TILEFUSE_RUNTIME_RUNTIME_H
