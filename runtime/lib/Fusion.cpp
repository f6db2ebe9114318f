//===- Fusion.cpp - a fusion and its kernels, one per specialization ------===//

#include "tilefuse/Runtime/Fusion.h"

#include "tilefuse/Compiler/Differentiate.h"
#include "tilefuse/Dialect/Fuse/IR/Fuse.h"

#include "mlir/IR/Diagnostics.h"
#include "mlir/Parser/Parser.h"
#include "llvm/Support/FormatVariadic.h"

using namespace tilefuse;

Fusion::Fusion(mlir::OwningOpRef<mlir::ModuleOp> owned)
    : module(std::move(owned)) {
  auto kernel = *module->getOps<fuse::KernelOp>().begin();
  kernelName = kernel.getSymName().str();
  for (auto [name, type] :
       llvm::zip(kernel.getInputNames().getAsValueRange<mlir::StringAttr>(),
                 kernel.getInputTypes()))
    inputPorts.push_back(portInfo(name, type));
  for (auto [name, type] :
       llvm::zip(kernel.getOutputNames().getAsValueRange<mlir::StringAttr>(),
                 kernel.getOutputTypes()))
    outputPorts.push_back(portInfo(name, type));
  kernel.walk([&](fuse::ReduceOp reduce) {
    fuse::ReduceKind kind = reduce.getKind();
    if (extreme.empty() && !reduce.isRowReduction() &&
        (kind == fuse::ReduceKind::Max || kind == fuse::ReduceKind::Min))
      extreme = fuse::stringifyReduceKind(kind).str();
  });
  hash = tilefuse::fingerprint(*module);
}

Fusion::~Fusion() = default;

llvm::Expected<std::shared_ptr<Fusion>> Fusion::parse(llvm::StringRef ir) {
  mlir::MLIRContext &context = Runtime::global().context();
  DiagnosticCollector diagnostics(context);
  mlir::OwningOpRef<mlir::ModuleOp> module =
      mlir::parseSourceString<mlir::ModuleOp>(ir, &context);
  if (!module)
    return diagnostics.error("invalid fuse IR");
  auto kernels = module->getOps<fuse::KernelOp>();
  int64_t count = std::distance(kernels.begin(), kernels.end());
  if (count != 1)
    return llvm::createStringError(llvm::formatv(
        "fuse IR must hold exactly one fuse.kernel, got {0}", count));
  return std::make_shared<Fusion>(std::move(module));
}

std::string Fusion::ir() const {
  std::string text;
  llvm::raw_string_ostream os(text);
  mlir::ModuleOp(module.get()).print(os);
  return text;
}

template <typename Kernel, typename Compile>
llvm::Expected<std::shared_ptr<const Kernel>> Fusion::lookup(
    std::map<Specialization, std::shared_ptr<const Kernel>> &kernels,
    Specialization specialization, const KernelAbi &abi, Compile compile) {
  Runtime &runtime = Runtime::global();
  if (!runtime.alwaysCompiles()) {
    std::lock_guard<std::mutex> lock(mutex);
    if (auto it = kernels.find(specialization); it != kernels.end())
      return it->second;
  }
  CompileOptions options;
  std::tie(options.dtype, options.n, options.aligned, options.target,
           std::ignore) = specialization;
  options.abi = abi;
  // The runtime serializes compilations of one key; the module is only read.
  auto kernel = compile(runtime, options);
  if (!kernel || runtime.alwaysCompiles())
    return kernel;
  std::lock_guard<std::mutex> lock(mutex);
  return kernels.try_emplace(std::move(specialization), *kernel).first->second;
}

llvm::Expected<std::shared_ptr<const CpuKernel>>
Fusion::cpuKernel(llvm::StringRef dtype, int64_t n, bool aligned,
                  const KernelAbi &abi) {
  return lookup(cpuKernels, {dtype.str(), n, aligned, "cpu", abi.str()}, abi,
                [&](Runtime &runtime, const CompileOptions &options) {
                  return runtime.getCpuKernel(*module, options);
                });
}

llvm::Expected<std::shared_ptr<const GpuKernel>>
Fusion::gpuKernel(llvm::StringRef dtype, int64_t n, bool aligned,
                  llvm::StringRef target, const KernelAbi &abi) {
  return lookup(gpuKernels,
                {dtype.str(), n, aligned, target.str(), abi.str()}, abi,
                [&](Runtime &runtime, const CompileOptions &options) {
                  return runtime.getGpuKernel(*module, options);
                });
}

llvm::Expected<FusionDerivative &> Fusion::derivative() {
  std::call_once(derived, [&] {
    mlir::MLIRContext *context = module->getContext();
    std::string messages;
    mlir::ScopedDiagnosticHandler handler(context, [&](mlir::Diagnostic &d) {
      messages += (messages.empty() ? "" : "\n") + d.str();
      return mlir::success();
    });
    auto kernel = *module->getOps<fuse::KernelOp>().begin();
    auto forward = mlir::OwningOpRef<mlir::ModuleOp>(
        mlir::ModuleOp::create(kernel.getLoc()));
    auto backward = mlir::OwningOpRef<mlir::ModuleOp>(
        mlir::ModuleOp::create(kernel.getLoc()));
    mlir::OpBuilder builder = mlir::OpBuilder::atBlockEnd(forward->getBody());
    mlir::FailureOr<Derivative> derivative =
        differentiate(kernel, DifferentiateOptions(), builder);
    if (mlir::failed(derivative)) {
      derivationError = messages.empty() ? "cannot differentiate " + kernelName
                                         : messages;
      return;
    }
    derivative->backward->moveBefore(backward->getBody(),
                                     backward->getBody()->end());
    std::vector<FusionDerivative::Source> sources;
    for (const Derivative::Source &source : derivative->backwardInputs)
      sources.push_back(
          {static_cast<FusionDerivative::Source::Kind>(source.kind),
           source.index});
    derivation = std::make_unique<FusionDerivative>(
        std::make_shared<Fusion>(std::move(forward)), std::move(backward),
        std::move(sources),
        std::vector<size_t>(derivative->gradientOf.begin(),
                            derivative->gradientOf.end()));
  });
  if (!derivation)
    return llvm::createStringError(derivationError);
  return *derivation;
}

FusionDerivative::FusionDerivative(std::shared_ptr<Fusion> forward,
                                   mlir::OwningOpRef<mlir::ModuleOp> backward,
                                   std::vector<Source> backwardInputs,
                                   std::vector<size_t> differentiable)
    : forwardFusion(std::move(forward)), backwardModule(std::move(backward)),
      sources(std::move(backwardInputs)),
      gradientOf(std::move(differentiable)) {
  for (const Source &source : sources)
    if (source.kind == Source::ForwardOutput)
      saved.push_back(source.index);
  llvm::sort(saved);
  saved.erase(std::unique(saved.begin(), saved.end()), saved.end());
}

FusionDerivative::~FusionDerivative() = default;

llvm::Expected<Fusion &>
FusionDerivative::backward(const std::vector<bool> &wanted) {
  std::lock_guard<std::mutex> lock(mutex);
  std::shared_ptr<Fusion> &fusion = backwards[wanted];
  if (!fusion) {
    mlir::OwningOpRef<mlir::ModuleOp> copy = backwardModule->clone();
    auto kernel = *copy->getOps<fuse::KernelOp>().begin();
    llvm::SmallVector<bool> keep(wanted.begin(), wanted.end());
    if (mlir::failed(keepGradients(kernel, keep)))
      return llvm::createStringError("cannot select the gradients of " +
                                     kernel.getSymName().str());
    fusion = std::make_shared<Fusion>(std::move(copy));
  }
  return *fusion;
}
