//===- Pipeline.cpp - fuse IR to PTX text or host code --------------------===//

#include "tilefuse/Compiler/Pipeline.h"
#include "tilefuse/Compiler/Passes.h"
#include "tilefuse/Compiler/TileConfig.h"

#include "mlir/Dialect/GPU/IR/CompilationInterfaces.h"
#include "mlir/ExecutionEngine/ExecutionEngine.h"
#include "mlir/ExecutionEngine/OptUtils.h"
#include "mlir/IR/Diagnostics.h"
#include "mlir/Pass/PassManager.h"
#include "mlir/Pass/PassRegistry.h"
#include "mlir/Target/LLVMIR/Dialect/Builtin/BuiltinToLLVMIRTranslation.h"
#include "mlir/Target/LLVMIR/Dialect/GPU/GPUToLLVMIRTranslation.h"
#include "mlir/Target/LLVMIR/Dialect/LLVMIR/LLVMToLLVMIRTranslation.h"
#include "mlir/Target/LLVMIR/Dialect/NVVM/NVVMToLLVMIRTranslation.h"
#include "mlir/Target/LLVMIR/Export.h"
#include "llvm/ADT/StringSwitch.h"
#include "llvm/IR/LLVMContext.h"
#include "llvm/IR/Module.h"
#include "llvm/Support/FormatVariadic.h"
#include "llvm/Support/TargetSelect.h"
#include "llvm/Support/raw_ostream.h"

#include <chrono>

using namespace mlir;
using namespace tilefuse;

namespace {

using Clock = std::chrono::steady_clock;

double millisecondsSince(Clock::time_point start) {
  return std::chrono::duration<double, std::milli>(Clock::now() - start)
      .count();
}

std::string printed(Operation *op) {
  std::string text;
  llvm::raw_string_ostream os(text);
  op->print(os);
  return text;
}

/// Runs a textual pass pipeline (anchored on the module) on `module`,
/// timing it as `stage`.
LogicalResult runPipeline(ModuleOp module, StringRef pipeline, StringRef stage,
                          CompileResult &result) {
  auto start = Clock::now();
  PassManager pm(module->getName());
  std::string errors;
  llvm::raw_string_ostream errorStream(errors);
  if (failed(parsePassPipeline(pipeline, pm, errorStream)))
    return module.emitError("internal pipeline '")
           << pipeline << "' does not parse: " << errors;
  if (failed(pm.run(module)))
    return failure();
  result.times.push_back({stage.str(), millisecondsSince(start)});
  return success();
}

std::string specializePipeline(const CompileOptions &options) {
  return llvm::formatv("fuse.kernel(fuse-specialize{{dtype={0} n={1} "
                       "aligned={2}}, canonicalize, fuse-hoist-broadcasts, "
                       "cse)",
                       options.dtype, options.n, options.aligned)
      .str();
}

std::string tilePipeline(const CompileOptions &options) {
  return llvm::formatv("fuse.kernel(fuse-select-tiles{{target={0} "
                       "threads-per-row={1} rows-per-block={2} "
                       "vector-width={3} row-on-chip={4}})",
                       options.target, options.threadsPerRow,
                       options.rowsPerBlock, options.vectorWidth,
                       options.rowOnChip)
      .str();
}

bool isCPU(const CompileOptions &options) { return options.target == "cpu"; }

/// Serializes the gpu.module to PTX with the NVVM target, timing LLVM IR
/// translation plus optimization and NVPTX code generation separately.
LogicalResult emitPTX(ModuleOp module, const CompileOptions &options,
                      Stage stop, CompileResult &result) {
  auto gpuModule = *module.getOps<gpu::GPUModuleOp>().begin();
  ArrayAttr targets = gpuModule.getTargetsAttr();
  auto target = targets && !targets.empty()
                    ? dyn_cast<gpu::TargetAttrInterface>(targets[0])
                    : gpu::TargetAttrInterface();
  if (!target)
    return gpuModule.emitError("no NVVM target attached to the GPU module");
  std::string llvmIR, ptx;
  auto start = Clock::now();
  Clock::time_point optimized;
  auto onOptimized = [&](llvm::Module &llvmModule) {
    optimized = Clock::now();
    llvm::raw_string_ostream os(llvmIR);
    llvmModule.print(os, nullptr);
  };
  auto onISA = [&](StringRef isa) { ptx = isa.str(); };
  gpu::TargetOptions targetOptions(
      options.cudaPath, /*librariesToLink=*/{}, /*cmdOptions=*/"",
      /*elfSection=*/"", gpu::CompilationTarget::Assembly,
      /*getSymbolTableCallback=*/{}, /*initialLlvmIRCallback=*/{},
      /*linkedLlvmIRCallback=*/{}, onOptimized, onISA);
  std::optional<SmallVector<char, 0>> object =
      target.serializeToObject(gpuModule, targetOptions);
  if (!object)
    return gpuModule.emitError("NVPTX code generation failed");
  result.times.push_back(
      {"llvm-ir", std::chrono::duration<double, std::milli>(optimized - start)
                      .count()});
  result.times.push_back({"ptx", millisecondsSince(optimized)});
  if (ptx.empty())
    ptx.assign(object->begin(), object->end());
  // Every math function must be resolved (libdevice linked and inlined).
  if (StringRef(ptx).contains(".extern .func"))
    return gpuModule.emitError("the PTX still calls an external function; "
                               "is libdevice under ")
           << options.cudaPath << "/nvvm/libdevice?";
  result.text = stop == Stage::LLVM ? llvmIR : ptx;
  return success();
}

} // namespace

std::optional<Stage> tilefuse::parseStage(StringRef name) {
  return llvm::StringSwitch<std::optional<Stage>>(name)
      .Case("fuse", Stage::Fuse)
      .Case("specialized", Stage::Specialized)
      .Case("tiled", Stage::Tiled)
      .Case("loops", Stage::Loops)
      .Case("llvm", Stage::LLVM)
      .Case("ptx", Stage::PTX)
      .Default(std::nullopt);
}

FailureOr<CompileResult> tilefuse::compile(ModuleOp module,
                                           const CompileOptions &options,
                                           Stage stop) {
  CompileResult result;
  if (!isKnownTarget(options.target))
    return module.emitError("unknown target '")
           << options.target << "': expected sm_80, sm_86, sm_89, sm_90 or cpu";
  if (stop == Stage::PTX && isCPU(options))
    return module.emitError("--emit=ptx needs a GPU target, not cpu");
  if (module.getOps<fuse::KernelOp>().empty())
    return module.emitError("no fuse.kernel to compile");
  auto finish = [&]() -> FailureOr<CompileResult> {
    result.text = printed(module);
    return result;
  };
  if (stop == Stage::Fuse)
    return finish();
  if (failed(runPipeline(module, specializePipeline(options), "specialize",
                         result)))
    return failure();
  if (stop == Stage::Specialized)
    return finish();
  if (failed(runPipeline(module, tilePipeline(options), "tile", result)))
    return failure();
  if (stop == Stage::Tiled)
    return finish();
  std::string lower = isCPU(options)
                          ? "fuse-lower-to-cpu, canonicalize, cse"
                          : "fuse-lower-to-gpu, canonicalize, cse";
  if (failed(runPipeline(module, lower, "loops", result)))
    return failure();
  if (stop == Stage::Loops)
    return finish();

  if (isCPU(options)) {
    if (failed(runPipeline(
            module,
            "convert-scf-to-cf, convert-math-to-llvm, convert-math-to-libm, "
            "convert-to-llvm, "
            "reconcile-unrealized-casts, canonicalize, cse",
            "llvm-dialect", result)))
      return failure();
    auto start = Clock::now();
    llvm::LLVMContext llvmContext;
    std::unique_ptr<llvm::Module> llvmModule =
        translateModuleToLLVMIR(module, llvmContext);
    if (!llvmModule)
      return module.emitError("translation to LLVM IR failed");
    result.times.push_back({"llvm-ir", millisecondsSince(start)});
    llvm::raw_string_ostream os(result.text);
    llvmModule->print(os, nullptr);
    return result;
  }

  std::string toNVVM = llvm::formatv(
      "convert-scf-to-cf, gpu.module(convert-gpu-to-nvvm{{index-bitwidth=64}, "
      "reconcile-unrealized-casts, canonicalize, cse), "
      "nvvm-attach-target{{chip={0} features=+ptx80 O=3}",
      options.target);
  if (failed(runPipeline(module, toNVVM, "nvvm", result)))
    return failure();
  if (failed(emitPTX(module, options, stop, result)))
    return failure();
  return result;
}

FailureOr<std::unique_ptr<ExecutionEngine>>
tilefuse::jitCompile(ModuleOp module) {
  static bool initialized = [] {
    llvm::InitializeNativeTarget();
    llvm::InitializeNativeTargetAsmPrinter();
    return true;
  }();
  (void)initialized;
  ExecutionEngineOptions engineOptions;
  engineOptions.transformer = makeOptimizingTransformer(
      /*optLevel=*/3, /*sizeLevel=*/0, /*targetMachine=*/nullptr);
  auto engine = ExecutionEngine::create(module, engineOptions);
  if (!engine) {
    std::string message = llvm::toString(engine.takeError());
    return module.emitError("JIT compilation failed: ") << message;
  }
  return std::move(*engine);
}

void tilefuse::registerTranslations(DialectRegistry &registry) {
  registerBuiltinDialectTranslation(registry);
  registerGPUDialectTranslation(registry);
  registerLLVMDialectTranslation(registry);
  registerNVVMDialectTranslation(registry);
}
