//===- Pipeline.h - fuse IR to PTX text or host code ------------*- C++ -*-===//
//
// The one "compile this" interface of the compiler: specialization, tile
// selection, lowering to loops, to the LLVM dialect, to LLVM IR and (GPU) to
// PTX. Errors are reported through the context's diagnostic handler and
// returned as failure; nothing reaches an LLVM ERROR.
//
//===----------------------------------------------------------------------===//

#ifndef TILEFUSE_COMPILER_PIPELINE_H
#define TILEFUSE_COMPILER_PIPELINE_H

#include "tilefuse/Compiler/TileConfig.h"

#include "mlir/IR/BuiltinOps.h"
#include "mlir/Support/LLVM.h"

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace mlir {
class DialectRegistry;
class ExecutionEngine;
} // namespace mlir

namespace tilefuse {

/// The stages of the pipeline, in order; `tilefuse-compile --emit` names them.
enum class Stage { Fuse, Specialized, Tiled, Loops, LLVM, PTX };

/// The stage named `name` (fuse, specialized, tiled, loops, llvm, ptx).
std::optional<Stage> parseStage(llvm::StringRef name);

struct CompileOptions {
  /// The kernel's ABI (scalars by pointer, multi-tensor).
  KernelAbi abi;
  /// Storage dtype of full and per-column float tensors, optionally with
  /// per-port overrides: "bf16,exp_avg=f32" (fuse-specialize's `dtype`).
  std::string dtype = "f32";
  int64_t n = 0;
  bool aligned = true;
  std::string target = "sm_90";
  // Tile overrides; 0 / "auto" keeps the heuristic's choice.
  int64_t threadsPerRow = 0;
  int64_t rowsPerBlock = 0;
  int64_t vectorWidth = 0;
  std::string rowOnChip = "auto";
  /// The CUDA toolkit whose libdevice to link; empty: findLibdevice().
  std::string cudaPath;
  /// When set, every stage is written there as
  /// <kernel>-<fingerprint>.<NN>-<stage>.{mlir,ll,ptx} (TILEFUSE_DUMP).
  std::string dumpDirectory;
};

/// What the runtime needs to know about one compiled kernel's interface
/// (KernelABI.h), without touching MLIR.
struct PortInfo {
  enum class Kind { Full, Row, Col, Scalar };
  /// "full", "row", "col" or "scalar", as the fuse types spell them.
  static llvm::StringRef kindName(Kind kind);
  std::string name;
  Kind kind;
  /// Storage type: f32, f16, bf16, f64, i1, i32 or i64.
  std::string dtype;
  /// Column-reduction outputs: the type of their partials (the compute type).
  std::string accumulatorDtype;
  /// Scalar inputs: passed by value, through a pointer shared by the whole
  /// launch, or (multi-tensor) through one pointer per tensor.
  enum class Binding { Value, Pointer, PerTensor };
  Binding binding = Binding::Value;
  /// Pointer bindings: the dtype of the one-element tensor pointed to.
  std::string pointee;
  /// Multi-tensor outputs: the input this output overwrites in place.
  std::string updates;
};

/// The port `name` of type `type` (a !fuse value type).
PortInfo portInfo(llvm::StringRef name, mlir::Type type);

struct KernelInfo {
  std::string name;
  std::vector<PortInfo> inputs, outputs;
  int64_t n = 0;
  TileConfig tile;
  /// Multi-tensor kernels (KernelABI.h): run over a table of tensors.
  bool multiTensor = false;
  /// Multi-tensor: the dtype of the skip flag, "" when there is none.
  std::string skipIf;
  bool hasColumnReduction() const {
    for (const PortInfo &output : outputs)
      if (output.kind == PortInfo::Kind::Col)
        return true;
    return false;
  }
};

/// Wall time of one stage on the calling thread. A fusion of several GPU
/// kernels compiles its first kernel's LLVM module on the calling thread and
/// the others' on helper threads beside it: "llvm-ir" ends when the first is
/// optimized, "ptx" when every module's PTX is joined.
struct StageTime {
  std::string stage;
  double milliseconds;
};

struct CompileResult {
  /// The requested stage: printed MLIR, LLVM IR text (for the GPU, a
  /// fusion's per-kernel modules linked back into one) or PTX text.
  std::string text;
  std::vector<StageTime> times;
  /// The kernels' interfaces, from the tiled stage on.
  std::vector<KernelInfo> kernels;
};

/// libdevice.10.bc (CUDA's math library as LLVM bitcode): in the toolkit
/// at $CUDA_HOME, $CUDA_PATH or /usr/local/cuda, else beside the binary or
/// shared library that holds the compiler (the self-contained
/// libtilefuse_torch.so ships it there). The paths it tried, on failure.
llvm::Expected<std::string> findLibdevice();

/// Compiles every fuse.kernel in `module` (which it rewrites) up to `stop`.
mlir::FailureOr<CompileResult> compile(mlir::ModuleOp module,
                                       const CompileOptions &options,
                                       Stage stop);

/// `ptx` with the kernel `entry` asking ptxas for at least `blocks` resident
/// blocks per SM (`.minnctapersm`, after its `.maxntid` or `.reqntid`):
/// ptxas then keeps the registers a thread uses within what `blocks` blocks
/// of that size leave it, spilling if it must. Fails where `entry` has
/// neither block size directive or already has a `.minnctapersm`.
llvm::Expected<std::string>
withMinBlocksPerSM(llvm::StringRef ptx, llvm::StringRef entry, int64_t blocks);

/// `ptx` with `.maxntid <threads>, 1, 1` on the entry `entry`, which must
/// have no block size (a folded block's: foldsResidentBlocks in
/// TileConfig.h): ptxas then gives a thread at most the registers that
/// many threads leave it, so that one such block fits an SM.
llvm::Expected<std::string>
withMaxThreads(llvm::StringRef ptx, llvm::StringRef entry, int64_t threads);

/// The canonical fingerprint of the fusions in `module` (hex SHA-256 of
/// their generic form): SSA names, comments, whitespace and locations do not
/// change it, any change to an op does. The cache keys on it.
std::string fingerprint(mlir::ModuleOp module);

/// JIT-compiles a module that compile() lowered for the CPU to `Stage::LLVM`.
/// Functions are called through ExecutionEngine::invokePacked.
mlir::FailureOr<std::unique_ptr<mlir::ExecutionEngine>>
jitCompile(mlir::ModuleOp module);

/// JIT-compiles LLVM IR text that compile() produced for the CPU (as the
/// disk cache keeps it); `anchor` only carries the context and location.
mlir::FailureOr<std::unique_ptr<mlir::ExecutionEngine>>
jitCompileLLVMIR(mlir::ModuleOp anchor, llvm::StringRef ir);

/// The LLVM IR translations compile() and jitCompile() need.
void registerTranslations(mlir::DialectRegistry &registry);

} // namespace tilefuse

#endif // TILEFUSE_COMPILER_PIPELINE_H
