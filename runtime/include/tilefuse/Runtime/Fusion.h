//===- Fusion.h - a fusion and its kernels, one per specialization -*- C++ -*-===//
//
// What the bindings hold: a module with one fuse.kernel (from the builder or
// a built-in), its interface, and the kernels compiled from it so far,
// looked up per (storage dtype, n, alignment, target) without printing or
// hashing the IR again. Compilation and caching go through the Runtime.
// Autograd runs a fusion's derivative (FusionDerivative), derived once.
//
//===----------------------------------------------------------------------===//

#ifndef TILEFUSE_RUNTIME_FUSION_H
#define TILEFUSE_RUNTIME_FUSION_H

#include "tilefuse/Runtime/Runtime.h"

#include <map>
#include <mutex>
#include <tuple>

namespace tilefuse {

class FusionDerivative;

class Fusion {
public:
  explicit Fusion(mlir::OwningOpRef<mlir::ModuleOp> module);
  ~Fusion();

  /// The fusion written in `ir`, fuse IR text holding one fuse.kernel
  /// (as Fusion::ir() prints it), parsed and verified in the global
  /// runtime's context; the parser's or verifier's messages on failure.
  static llvm::Expected<std::shared_ptr<Fusion>> parse(llvm::StringRef ir);

  const std::string &name() const { return kernelName; }
  /// The unspecialized interface: storage dtypes as the fusion declares them.
  const std::vector<PortInfo> &inputs() const { return inputPorts; }
  const std::vector<PortInfo> &outputs() const { return outputPorts; }
  std::string ir() const;
  const std::string &fingerprint() const { return hash; }
  /// "max" or "min" where the fusion reduces columns by one (which has no
  /// value over zero rows: torch.amax refuses them), else empty.
  const std::string &columnExtreme() const { return extreme; }

  /// The kernel for storage `dtype` ("bf16", or with per-port overrides
  /// "bf16,exp_avg=f32": see fuse-specialize), row length `n`, 16-byte
  /// alignment `aligned`, `target` ("cpu" for cpuKernel, sm_XX for
  /// gpuKernel) and `abi` (scalars by pointer, multi-tensor: KernelABI.h;
  /// n = 0).
  llvm::Expected<std::shared_ptr<const CpuKernel>>
  cpuKernel(llvm::StringRef dtype, int64_t n, bool aligned,
            const KernelAbi &abi = {});
  llvm::Expected<std::shared_ptr<const GpuKernel>>
  gpuKernel(llvm::StringRef dtype, int64_t n, bool aligned,
            llvm::StringRef target, const KernelAbi &abi = {});

  /// What autograd runs for this fusion, derived on first use for
  /// gradients of every float output and every differentiable input.
  llvm::Expected<FusionDerivative &> derivative();

private:
  /// (dtype, n, aligned, target, KernelAbi::str()).
  using Specialization =
      std::tuple<std::string, int64_t, bool, std::string, std::string>;
  template <typename Kernel, typename Compile>
  llvm::Expected<std::shared_ptr<const Kernel>>
  lookup(std::map<Specialization, std::shared_ptr<const Kernel>> &kernels,
         Specialization specialization, const KernelAbi &abi,
         Compile compile);

  mlir::OwningOpRef<mlir::ModuleOp> module;
  std::string kernelName, hash, extreme;
  std::vector<PortInfo> inputPorts, outputPorts;
  std::mutex mutex;
  std::map<Specialization, std::shared_ptr<const CpuKernel>> cpuKernels;
  std::map<Specialization, std::shared_ptr<const GpuKernel>> gpuKernels;
  std::once_flag derived;
  std::unique_ptr<FusionDerivative> derivation;
  std::string derivationError;
};

/// A fusion's derivative (tilefuse/Compiler/Differentiate.h): a forward that
/// also outputs the per-row statistics the backward reads, and a backward
/// per set of inputs that need gradients. Every backward takes the gradient
/// of every float output of the fusion (zeros where autograd has none).
class FusionDerivative {
public:
  struct Source {
    enum Kind { OutputGradient, Input, ForwardOutput };
    Kind kind;
    /// Which output, fusion input, or output of forward().
    size_t index;
  };

  FusionDerivative(std::shared_ptr<Fusion> forward,
                   mlir::OwningOpRef<mlir::ModuleOp> backward,
                   std::vector<Source> backwardInputs,
                   std::vector<size_t> differentiable);
  ~FusionDerivative();

  /// The fusion's outputs, then the saved statistics.
  Fusion &forward() const { return *forwardFusion; }
  /// Where each input of every backward comes from, in order.
  const std::vector<Source> &backwardInputs() const { return sources; }
  /// The outputs of forward() the backward reads, in increasing order.
  const std::vector<size_t> &savedOutputs() const { return saved; }
  /// The inputs that have gradients (full, per-row and per-column floats).
  const std::vector<size_t> &differentiable() const { return gradientOf; }
  /// The backward computing the gradients of the inputs flagged in `wanted`
  /// (a flag per differentiable() input), in that order.
  llvm::Expected<Fusion &> backward(const std::vector<bool> &wanted);

private:
  std::shared_ptr<Fusion> forwardFusion;
  mlir::OwningOpRef<mlir::ModuleOp> backwardModule;
  std::vector<Source> sources;
  std::vector<size_t> saved;
  std::vector<size_t> gradientOf;
  std::mutex mutex;
  std::map<std::vector<bool>, std::shared_ptr<Fusion>> backwards;
};

} // namespace tilefuse

#endif // TILEFUSE_RUNTIME_FUSION_H
