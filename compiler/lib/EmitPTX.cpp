//===- EmitPTX.cpp - LLVM dialect kernels to PTX text ---------------------===//

#include "EmitPTX.h"

#include "Libdevice.h"
#include "tilefuse/Compiler/Passes.h"

#include "mlir/Dialect/GPU/IR/GPUDialect.h"
#include "mlir/Dialect/LLVMIR/LLVMDialect.h"
#include "mlir/IR/OwningOpRef.h"
#include "mlir/Target/LLVMIR/Export.h"
#include "llvm/ADT/StringMap.h"
#include "llvm/ADT/StringSet.h"
#include "llvm/AsmParser/Parser.h"
#include "llvm/IR/DiagnosticInfo.h"
#include "llvm/IR/DiagnosticPrinter.h"
#include "llvm/IR/LLVMContext.h"
#include "llvm/IR/LegacyPassManager.h"
#include "llvm/IR/Module.h"
#include "llvm/IR/OptBisect.h"
#include "llvm/IR/PrintPasses.h"
#include "llvm/Linker/Linker.h"
#include "llvm/MC/TargetRegistry.h"
#include "llvm/Pass.h"
#include "llvm/Passes/PassBuilder.h"
#include "llvm/Passes/StandardInstrumentations.h"
#include "llvm/Support/MemoryBuffer.h"
#include "llvm/Support/SourceMgr.h"
#include "llvm/Support/TargetSelect.h"
#include "llvm/Support/Threading.h"
#include "llvm/Support/raw_ostream.h"
#include "llvm/Target/TargetMachine.h"
#include "llvm/TargetParser/Triple.h"

#include <mutex>
#include <thread>

using namespace mlir;
using namespace tilefuse;

namespace {

/// What every PTX compile for one chip reuses: libdevice, read once, from
/// which a kernel links only the math functions it calls, and NVPTX target
/// machines. One per calling thread: LLVM code generation is not safe
/// across threads on one TargetMachine, so the threads that compile a
/// fusion's further kernels each borrow one of the calling thread's.
struct NVPTXBackend {
  const llvm::Target *target = nullptr;
  std::string chip;
  std::unique_ptr<Libdevice> libdevice;
  /// The calling thread's, then one per helper thread, made on first use.
  std::vector<std::unique_ptr<llvm::TargetMachine>> machines;

  /// The `index`th target machine, or null if LLVM cannot make one.
  llvm::TargetMachine *machine(size_t index) {
    while (machines.size() <= index) {
      std::unique_ptr<llvm::TargetMachine> made(target->createTargetMachine(
          llvm::Triple("nvptx64-nvidia-cuda"), chip, "+ptx80",
          llvm::TargetOptions(), std::nullopt, std::nullopt,
          llvm::CodeGenOptLevel::Aggressive));
      if (!made)
        return nullptr;
      machines.push_back(std::move(made));
    }
    return machines[index].get();
  }
};

FailureOr<NVPTXBackend *> getNVPTXBackend(Operation *anchor, StringRef chip,
                                          StringRef cudaPath) {
  static std::once_flag initialized;
  std::call_once(initialized, [] {
    LLVMInitializeNVPTXTargetInfo();
    LLVMInitializeNVPTXTarget();
    LLVMInitializeNVPTXTargetMC();
    LLVMInitializeNVPTXAsmPrinter();
  });
  thread_local llvm::StringMap<NVPTXBackend> backends;
  std::string key = (chip + "|" + cudaPath).str();
  auto it = backends.find(key);
  if (it != backends.end())
    return &it->second;

  NVPTXBackend backend;
  std::string error;
  backend.target = llvm::TargetRegistry::lookupTarget(
      llvm::Triple("nvptx64-nvidia-cuda"), error);
  if (!backend.target)
    return anchor->emitError("the NVPTX backend is unavailable: ") << error;
  backend.chip = chip.str();
  llvm::Expected<std::string> path = libdevicePath(cudaPath);
  if (!path)
    return anchor->emitError(llvm::toString(path.takeError()));
  auto buffer = llvm::MemoryBuffer::getFile(*path);
  if (!buffer)
    return anchor->emitError("cannot read libdevice at ")
           << *path << ": " << buffer.getError().message();
  backend.libdevice = std::make_unique<Libdevice>(std::move(*buffer));
  return &(backends[key] = std::move(backend));
}

/// Skips the NVPTX backend's machine code sinking, which moves each load
/// down to its first use: past the branches of a libdevice function (erf
/// has one per element) or into a guarded store's block, where it waits for
/// the stores and loads before it (geglu_bwd bf16, n = 32000: 1 of the 6
/// loads a group issues ahead stayed before the first branch). Only for
/// kernels that issue loads ahead: elsewhere the sinking moves per-row work
/// into the row leader's branch (3-6% fewer instructions in the
/// issue-bound cross-entropy kernels).
class KeepLoadOrder : public llvm::OptPassGate {
public:
  bool isEnabled() const override { return true; }
  bool shouldRunPass(llvm::StringRef pass, llvm::StringRef) const override {
    return pass != "machine-sink";
  }
};

/// One kernel of a fusion, or all of them, as an LLVM module in a context
/// of its own, so that a fusion's kernels compile on separate threads.
struct KernelModule {
  // Declared before the module, which it outlives.
  std::unique_ptr<llvm::LLVMContext> context =
      std::make_unique<llvm::LLVMContext>();
  std::unique_ptr<llvm::Module> module;
  llvm::TargetMachine *machine = nullptr;
  /// What LLVM reported (on whichever thread compiled the module), for the
  /// calling thread to emit.
  SmallVector<std::pair<llvm::DiagnosticSeverity, std::string>> diagnostics;
  Clock::time_point optimized;
  std::string optimizedIR;
  llvm::SmallString<0> ptx;
  bool emitted = false;
};

/// Copies of `gpuModule`, one per kernel, each without the other kernels
/// (what only those used is dropped after translation); none when it has
/// a single kernel.
SmallVector<OwningOpRef<gpu::GPUModuleOp>>
splitPerKernel(gpu::GPUModuleOp gpuModule) {
  StringRef kernelAttr = gpu::GPUDialect::getKernelFuncAttrName();
  SmallVector<StringRef> kernels;
  for (auto function : gpuModule.getOps<LLVM::LLVMFuncOp>())
    if (function->hasAttr(kernelAttr))
      kernels.push_back(function.getSymName());
  SmallVector<OwningOpRef<gpu::GPUModuleOp>> copies;
  if (kernels.size() < 2)
    return copies;
  for (StringRef kernel : kernels) {
    OwningOpRef<gpu::GPUModuleOp> copy = gpuModule.clone();
    for (auto function :
         llvm::make_early_inc_range(copy->getOps<LLVM::LLVMFuncOp>()))
      if (function->hasAttr(kernelAttr) && function.getSymName() != kernel)
        function.erase();
    copies.push_back(std::move(copy));
  }
  return copies;
}

/// Translates `gpuModule` into `part`'s context, drops the declarations and
/// local globals nothing uses (in a kernel's copy, those of the other
/// kernels) and links the libdevice functions it calls.
LogicalResult translate(gpu::GPUModuleOp gpuModule, Libdevice &libdevice,
                        KernelModule &part) {
  bool keepLoadOrder = false;
  for (Operation &function : gpuModule.getBody()->getOperations())
    keepLoadOrder |= bool(function.removeAttr(kKeepLoadOrderAttr));
  if (keepLoadOrder) {
    // Stateless, shared by every context.
    static KeepLoadOrder gate;
    part.context->setOptPassGate(gate);
  }
  part.context->setDiagnosticHandlerCallBack(
      [](const llvm::DiagnosticInfo *info, void *context) {
        std::string message;
        llvm::raw_string_ostream os(message);
        llvm::DiagnosticPrinterRawOStream printer(os);
        info->print(printer);
        static_cast<KernelModule *>(context)->diagnostics.emplace_back(
            info->getSeverity(), std::move(message));
      },
      &part);
  part.module = translateModuleToLLVMIR(gpuModule, *part.context, "tilefuse");
  if (!part.module)
    return gpuModule.emitError("translation to LLVM IR failed");
  part.module->setTargetTriple(part.machine->getTargetTriple());
  part.module->setDataLayout(part.machine->createDataLayout());
  for (llvm::Function &function :
       llvm::make_early_inc_range(part.module->functions()))
    if (function.isDeclaration() && function.use_empty())
      function.eraseFromParent();
  for (llvm::GlobalVariable &global :
       llvm::make_early_inc_range(part.module->globals()))
    if (global.hasLocalLinkage() && global.use_empty())
      global.eraseFromParent();
  if (llvm::Error error = libdevice.linkInto(*part.module))
    return gpuModule.emitError("cannot link libdevice: ")
           << llvm::toString(std::move(error));
  return success();
}

/// Optimizes `part` at O3, keeps its text when `printIR`, and generates its
/// PTX when `generate`, its local symbols suffixed with `$<index>` for any
/// module but the first, so that their PTX joins the first's whatever
/// either module defines (libdevice's tables, say, when both call one math
/// function).
void compilePart(KernelModule &part, size_t index, bool printIR,
                 bool generate) {
  llvm::LoopAnalysisManager loops;
  llvm::FunctionAnalysisManager functions;
  llvm::CGSCCAnalysisManager cgscc;
  llvm::ModuleAnalysisManager modules;
  // `--time-passes` times the optimization pipeline as well as code
  // generation (instrumented only then: it costs time).
  llvm::PassInstrumentationCallbacks instrumentation;
  std::optional<llvm::StandardInstrumentations> standard;
  if (llvm::TimePassesIsEnabled) {
    standard.emplace(*part.context, /*DebugLogging=*/false);
    standard->registerCallbacks(instrumentation, &modules);
  }
  llvm::PassBuilder passBuilder(part.machine, llvm::PipelineTuningOptions(),
                                std::nullopt,
                                standard ? &instrumentation : nullptr);
  passBuilder.registerModuleAnalyses(modules);
  passBuilder.registerCGSCCAnalyses(cgscc);
  passBuilder.registerFunctionAnalyses(functions);
  passBuilder.registerLoopAnalyses(loops);
  passBuilder.crossRegisterProxies(loops, functions, cgscc, modules);
  passBuilder.buildPerModuleDefaultPipeline(llvm::OptimizationLevel::O3)
      .run(*part.module, modules);
  part.optimized = Clock::now();
  if (printIR) {
    llvm::raw_string_ostream os(part.optimizedIR);
    part.module->print(os, nullptr);
  }
  if (!generate)
    return;
  if (index > 0)
    for (llvm::GlobalValue &value : part.module->global_values())
      if (value.hasLocalLinkage())
        value.setName((value.hasName() ? value.getName() : "__unnamed") + "$" +
                      Twine(index));
  llvm::raw_svector_ostream ptxStream(part.ptx);
  llvm::legacy::PassManager codegen;
  if (part.machine->addPassesToEmitFile(codegen, ptxStream, nullptr,
                                        llvm::CodeGenFileType::AssemblyFile))
    return;
  codegen.run(*part.module);
  part.emitted = true;
}

/// The optimized LLVM IR of a fusion's kernel modules, linked back into one
/// module (as text: each lives in its own context).
FailureOr<std::string> joinIR(Operation *anchor,
                              MutableArrayRef<KernelModule> parts) {
  if (parts.size() == 1)
    return std::move(parts.front().optimizedIR);
  llvm::LLVMContext context;
  std::unique_ptr<llvm::Module> joined;
  for (KernelModule &part : parts) {
    llvm::SMDiagnostic diagnostic;
    std::unique_ptr<llvm::Module> module =
        llvm::parseAssemblyString(part.optimizedIR, diagnostic, context);
    if (!module ||
        (joined && llvm::Linker::linkModules(*joined, std::move(module))))
      return anchor->emitError("cannot join the kernels' LLVM IR: ")
             << diagnostic.getMessage();
    if (!joined)
      joined = std::move(module);
  }
  std::string text;
  llvm::raw_string_ostream os(text);
  joined->print(os, nullptr);
  return text;
}

/// The PTX of a fusion's kernel modules as one module: the first's header,
/// then each module's `.extern` declarations (each once) and the rest of it
/// (its symbols are its own: compilePart).
FailureOr<std::string> joinPTX(Operation *anchor,
                               ArrayRef<KernelModule> parts) {
  std::string joined;
  llvm::StringSet<> declared;
  for (auto [index, part] : llvm::enumerate(parts)) {
    StringRef rest = part.ptx;
    if (index > 0) {
      size_t header = rest.find("\n.address_size ");
      size_t end = rest.find('\n', header + 1);
      if (header == StringRef::npos || end == StringRef::npos)
        return anchor->emitError("the NVPTX backend's PTX has no header");
      rest = rest.drop_front(end + 1);
    }
    while (!rest.empty()) {
      auto [line, tail] = rest.split('\n');
      rest = tail;
      if (line.starts_with(".extern ") && !declared.insert(line).second)
        continue;
      joined.append(line.begin(), line.end());
      joined += '\n';
    }
  }
  return joined;
}

/// Whether LLVM's global debugging state (pass timers, bisection, IR
/// printing) asks for one module at a time.
bool serialOnly() {
  return llvm::TimePassesIsEnabled || llvm::getGlobalPassGate().isEnabled() ||
         llvm::shouldPrintBeforeSomePass() || llvm::shouldPrintAfterSomePass();
}

} // namespace

LogicalResult tilefuse::emitPTX(ModuleOp module, const CompileOptions &options,
                                Stage stop, CompileResult &result,
                                std::string *optimizedIR) {
  auto gpuModule = *module.getOps<gpu::GPUModuleOp>().begin();
  auto start = Clock::now();
  FailureOr<NVPTXBackend *> backend =
      getNVPTXBackend(gpuModule, options.target, options.cudaPath);
  if (failed(backend))
    return failure();

  // A fusion's kernels (a backward norm's row kernel and its column
  // finalize) compile as separate modules, whatever the machine (the same
  // PTX everywhere): the first on this thread, the others on as many
  // helper threads as there are other CPUs.
  SmallVector<OwningOpRef<gpu::GPUModuleOp>> perKernel =
      splitPerKernel(gpuModule);
  SmallVector<KernelModule> parts(std::max<size_t>(perKernel.size(), 1));
  for (auto [index, part] : llvm::enumerate(parts)) {
    part.machine = (*backend)->machine(index);
    if (!part.machine)
      return gpuModule.emitError("cannot create an NVPTX target machine for ")
             << options.target;
    if (failed(translate(perKernel.empty() ? gpuModule : *perKernel[index],
                         *(*backend)->libdevice, part)))
      return failure();
  }
  perKernel.clear();

  bool printIR = stop == Stage::LLVM || optimizedIR;
  bool generate = stop != Stage::LLVM;
  size_t cpus = llvm::hardware_concurrency().compute_thread_count();
  size_t helperCount = serialOnly() ? 0 : std::min(parts.size(), cpus) - 1;
  std::vector<std::thread> helpers;
  for (size_t helper = 0; helper < helperCount; ++helper)
    helpers.emplace_back([&, helper] {
      for (size_t index = 1 + helper; index < parts.size();
           index += helperCount)
        compilePart(parts[index], index, printIR, generate);
    });
  compilePart(parts.front(), 0, printIR, generate);
  if (helpers.empty())
    for (size_t index = 1; index < parts.size(); ++index)
      compilePart(parts[index], index, printIR, generate);
  for (std::thread &helper : helpers)
    helper.join();
  Clock::time_point optimized = parts.front().optimized;
  result.times.push_back({"llvm-ir", millisecondsBetween(start, optimized)});

  bool failedInLLVM = false;
  for (KernelModule &part : parts)
    for (auto &[severity, message] : part.diagnostics) {
      if (severity == llvm::DS_Error) {
        gpuModule.emitError("LLVM: ") << message;
        failedInLLVM = true;
      } else if (severity == llvm::DS_Warning) {
        gpuModule.emitWarning("LLVM: ") << message;
      }
    }
  if (failedInLLVM)
    return failure();
  if (printIR) {
    FailureOr<std::string> text = joinIR(gpuModule, parts);
    if (failed(text))
      return failure();
    if (!generate) {
      result.text = std::move(*text);
      return success();
    }
    *optimizedIR = std::move(*text);
  }
  for (const KernelModule &part : parts)
    if (!part.emitted)
      return gpuModule.emitError("the NVPTX backend cannot emit PTX");
  FailureOr<std::string> ptx = joinPTX(gpuModule, parts);
  if (failed(ptx))
    return failure();
  result.times.push_back({"ptx", millisecondsSince(optimized)});
  // Every math function must be resolved (libdevice linked and inlined).
  if (StringRef(*ptx).contains(".extern .func"))
    return gpuModule.emitError("the PTX still calls an external function");
  result.text = std::move(*ptx);
  return success();
}
