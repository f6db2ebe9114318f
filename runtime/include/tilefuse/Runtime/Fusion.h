//===- Fusion.h - a fusion and its kernels, one per specialization -*- C++ -*-===//
//
// What the bindings hold: a module with one fuse.kernel (from the builder or
// a built-in), its interface, and the kernels compiled from it so far,
// looked up per (storage dtype, n, alignment, target) without printing or
// hashing the IR again. Compilation and caching go through the Runtime.
//
//===----------------------------------------------------------------------===//

#ifndef TILEFUSE_RUNTIME_FUSION_H
#define TILEFUSE_RUNTIME_FUSION_H

#include "tilefuse/Runtime/Runtime.h"

#include <map>
#include <mutex>
#include <tuple>

namespace tilefuse {

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

  /// The kernel for storage `dtype`, row length `n`, 16-byte alignment
  /// `aligned`, `target` ("cpu" for cpuKernel, sm_XX for gpuKernel) and
  /// `abi` (scalars by pointer, multi-tensor: KernelABI.h; n = 0).
  llvm::Expected<std::shared_ptr<const CpuKernel>>
  cpuKernel(llvm::StringRef dtype, int64_t n, bool aligned,
            const KernelAbi &abi = {});
  llvm::Expected<std::shared_ptr<const GpuKernel>>
  gpuKernel(llvm::StringRef dtype, int64_t n, bool aligned,
            llvm::StringRef target, const KernelAbi &abi = {});

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
  std::string kernelName, hash;
  std::vector<PortInfo> inputPorts, outputPorts;
  std::mutex mutex;
  std::map<Specialization, std::shared_ptr<const CpuKernel>> cpuKernels;
  std::map<Specialization, std::shared_ptr<const GpuKernel>> gpuKernels;
};

} // namespace tilefuse

#endif // TILEFUSE_RUNTIME_FUSION_H
