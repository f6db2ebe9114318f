//===- Pipeline.cpp - fuse IR to PTX text or host code --------------------===//

#include "tilefuse/Compiler/Pipeline.h"
#include "tilefuse/Compiler/KernelABI.h"
#include "tilefuse/Compiler/Passes.h"
#include "tilefuse/Compiler/TileConfig.h"

#include "EmitPTX.h"

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
#include "llvm/ADT/StringExtras.h"
#include "llvm/ADT/StringSwitch.h"
#include "llvm/AsmParser/Parser.h"
#include "llvm/IR/LLVMContext.h"
#include "llvm/IR/Module.h"
#include "llvm/Pass.h"
#include "llvm/Support/FileSystem.h"
#include "llvm/Support/FormatVariadic.h"
#include "llvm/Support/SHA256.h"
#include "llvm/Support/SourceMgr.h"
#include "llvm/Support/TargetSelect.h"
#include "llvm/Support/raw_ostream.h"

#include <functional>
#include <mutex>

using namespace mlir;
using namespace tilefuse;

namespace {

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
  if (llvm::TimePassesIsEnabled)
    pm.enableTiming();
  if (failed(pm.run(module)))
    return failure();
  result.times.push_back({stage.str(), millisecondsSince(start)});
  return success();
}

std::string specializePipeline(const CompileOptions &options) {
  std::string abi =
      options.abi.isDefault() ? "" : " abi=" + options.abi.str();
  return llvm::formatv("fuse.kernel(fuse-specialize{{dtype={0} n={1} "
                       "aligned={2}{3}}, canonicalize, "
                       "fuse-hoist-broadcasts, cse)",
                       options.dtype, options.n, options.aligned, abi)
      .str();
}

std::string tilePipeline(const CompileOptions &options) {
  return llvm::formatv("fuse.kernel(fuse-select-tiles{{target={0} "
                       "threads-per-row={1} rows-per-block={2} "
                       "vector-width={3} row-on-chip={4}}, "
                       "fuse-merge-reductions, fuse-reciprocal-divisions, "
                       "fuse-stage-rows)",
                       options.target, options.threadsPerRow,
                       options.rowsPerBlock, options.vectorWidth,
                       options.rowOnChip)
      .str();
}

bool isCPU(const CompileOptions &options) { return options.target == "cpu"; }

std::string dtypeName(Type type) {
  std::string text;
  llvm::raw_string_ostream os(text);
  type.print(os);
  return text;
}

/// The interfaces of the tiled kernels in `module`.
LogicalResult collectKernelInfo(ModuleOp module, CompileResult &result) {
  for (auto kernel : module.getOps<fuse::KernelOp>()) {
    KernelInfo info;
    info.name = kernel.getSymName().str();
    FailureOr<TileConfig> tile = TileConfig::fromKernel(kernel);
    FailureOr<KernelShape> shape = getKernelShape(kernel);
    if (failed(tile) || failed(shape))
      return failure();
    FailureOr<KernelAbi> abi = getKernelAbi(kernel);
    if (failed(abi))
      return failure();
    info.tile = *tile;
    info.n = shape->n;
    info.multiTensor = abi->multiTensor;
    info.skipIf = abi->skipIf;
    for (auto [name, type] :
         llvm::zip(kernel.getInputNames().getAsValueRange<StringAttr>(),
                   kernel.getInputTypes())) {
      PortInfo port = portInfo(name, type);
      if (auto it = abi->scalarPointers.find(port.name);
          it != abi->scalarPointers.end()) {
        port.binding = PortInfo::Binding::Pointer;
        port.pointee = it->second;
      } else if (auto it = abi->perTensorScalars.find(port.name);
                 it != abi->perTensorScalars.end()) {
        port.binding = PortInfo::Binding::PerTensor;
        port.pointee = it->second;
      }
      info.inputs.push_back(port);
    }
    auto yield = cast<fuse::YieldOp>(kernel.getEntryBlock().getTerminator());
    for (auto [name, value] :
         llvm::zip(kernel.getOutputNames().getAsValueRange<StringAttr>(),
                   yield.getValues())) {
      PortInfo port = portInfo(name, value.getType());
      if (port.kind == PortInfo::Kind::Col) {
        Value accumulator = value;
        if (auto cast = value.getDefiningOp<fuse::CastOp>())
          accumulator = cast.getInput();
        port.accumulatorDtype = dtypeName(
            cast<fuse::ValueType>(accumulator.getType()).getElementType());
      }
      if (auto it = abi->inplace.find(port.name); it != abi->inplace.end())
        port.updates = it->second;
      info.outputs.push_back(port);
    }
    result.kernels.push_back(std::move(info));
  }
  return success();
}

/// Multi-tensor kernels take their table by value: the byval attribute the
/// GPU-to-NVVM conversion does not carry from gpu.func arguments is set on
/// the LLVM functions (NVPTX then reads the table with ld.param).
void passTablesByValue(ModuleOp module) {
  module.walk([](LLVM::LLVMFuncOp function) {
    auto table = function->getAttrOfType<TypeAttr>(kParamTableAttr);
    if (!table)
      return;
    function.setArgAttr(0, LLVM::LLVMDialect::getByValAttrName(), table);
    function.setArgAttr(0, LLVM::LLVMDialect::getAlignAttrName(),
                        Builder(function).getI64IntegerAttr(8));
    function->removeAttr(kParamTableAttr);
  });
}

/// The conversion to control flow leaves a loop's annotation on its
/// branches as a discardable attribute, which the translation to LLVM IR
/// ignores: it becomes the branch's own, so LLVM sees the loop metadata.
void annotateLoopBranches(ModuleOp module) {
  module.walk([](Operation *op) {
    auto annotation =
        op->getAttrOfType<LLVM::LoopAnnotationAttr>(kLoopAnnotationAttr);
    if (!annotation)
      return;
    op->removeAttr(kLoopAnnotationAttr);
    if (auto branch = dyn_cast<LLVM::BrOp>(op))
      branch.setLoopAnnotationAttr(annotation);
    else if (auto branch = dyn_cast<LLVM::CondBrOp>(op))
      branch.setLoopAnnotationAttr(annotation);
  });
}

/// Writes each stage of one compilation to options.dumpDirectory, numbered.
class StageDumper {
public:
  StageDumper(ModuleOp module, const CompileOptions &options) : anchor(module) {
    if (options.dumpDirectory.empty())
      return;
    std::string name = "fusion";
    if (auto kernels = module.getOps<fuse::KernelOp>(); !kernels.empty())
      // At most 64 characters of it: the fingerprint keeps files apart,
      // and a file name has a limit (255 bytes on most file systems).
      name = (*kernels.begin()).getSymName().take_front(64).str();
    prefix = options.dumpDirectory + "/" + name + "-" +
             fingerprint(module).substr(0, 12) + "." + options.target + "." +
             options.dtype + "." + std::to_string(options.n);
    // Asked for and impossible is an error, not a compile without them.
    std::error_code error =
        llvm::sys::fs::create_directories(options.dumpDirectory);
    if (!error && !llvm::sys::fs::is_directory(options.dumpDirectory))
      error = std::make_error_code(std::errc::not_a_directory);
    if (!error)
      error = llvm::sys::fs::access(options.dumpDirectory,
                                    llvm::sys::fs::AccessMode::Write);
    if (error)
      fail(options.dumpDirectory, error);
  }
  /// False (an error emitted) where the dump directory or a stage's file
  /// cannot be written: the compile fails, as it was asked for them.
  bool isUsable() const { return usable; }
  bool enabled() const { return !prefix.empty(); }
  /// The module as printed after `stage` (printed only when dumping:
  /// printing costs 4-6% of a compile).
  void operator()(StringRef stage, ModuleOp module) {
    if (enabled())
      (*this)(stage, printed(module));
  }
  void operator()(StringRef stage, StringRef text, StringRef extension = "mlir") {
    if (!enabled())
      return;
    std::string path =
        llvm::formatv("{0}.{1:2}-{2}.{3}", prefix, index++, stage, extension)
            .str();
    std::error_code error;
    llvm::raw_fd_ostream os(path, error);
    if (error)
      return fail(path, error);
    os << text;
    // A failed write (a full disk) left pending would end the process when
    // the stream goes.
    os.close();
    if (os.has_error()) {
      fail(path, os.error());
      os.clear_error();
    }
  }

private:
  void fail(StringRef path, std::error_code error) {
    if (usable)
      anchor.emitError("cannot write the stages to TILEFUSE_DUMP's '")
          << path << "': " << error.message();
    usable = false;
  }

  ModuleOp anchor;
  std::string prefix;
  int index = 0;
  bool usable = true;
};

} // namespace

PortInfo tilefuse::portInfo(StringRef name, Type type) {
  auto value = cast<fuse::ValueType>(type);
  PortInfo port;
  port.name = name.str();
  switch (value.getKind()) {
  case fuse::ValueKind::Full: port.kind = PortInfo::Kind::Full; break;
  case fuse::ValueKind::Row: port.kind = PortInfo::Kind::Row; break;
  case fuse::ValueKind::Col: port.kind = PortInfo::Kind::Col; break;
  case fuse::ValueKind::Scalar: port.kind = PortInfo::Kind::Scalar; break;
  }
  port.dtype = dtypeName(value.getElementType());
  return port;
}

StringRef PortInfo::kindName(Kind kind) {
  switch (kind) {
  case Kind::Full: return "full";
  case Kind::Row: return "row";
  case Kind::Col: return "col";
  case Kind::Scalar: return "scalar";
  }
  llvm_unreachable("unknown port kind");
}

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

/// tilefuse::compile, each stage given to `dump`.
static FailureOr<CompileResult> compileStages(ModuleOp module,
                                              const CompileOptions &options,
                                              Stage stop, StageDumper &dump) {
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
  dump("fuse", module);
  if (stop == Stage::Fuse)
    return finish();
  if (failed(runPipeline(module, specializePipeline(options), "specialize",
                         result)))
    return failure();
  dump("specialized", module);
  if (stop == Stage::Specialized)
    return finish();
  if (failed(runPipeline(module, tilePipeline(options), "tile", result)) ||
      failed(collectKernelInfo(module, result)))
    return failure();
  dump("tiled", module);
  if (stop == Stage::Tiled)
    return finish();
  // arith's canonicalization folds truncf(sitofp(x)) into one conversion,
  // which rounds once where an integer converted to f32 and then to a
  // 16-bit float (fuse.cast, as PyTorch converts) rounds twice.
  std::string canonicalize =
      "canonicalize{disable-patterns={(anonymous namespace)::"
      "TruncFSIToFPToSIToFP,(anonymous namespace)::TruncFUIToFPToUIToFP}}, "
      "cse";
  std::string lower =
      (isCPU(options) ? "fuse-lower-to-cpu, " : "fuse-lower-to-gpu, ") +
      canonicalize;
  if (failed(runPipeline(module, lower, "loops", result)))
    return failure();
  dump("loops", module);
  if (stop == Stage::Loops)
    return finish();

  if (isCPU(options)) {
    // arith-expand rounds f32 -> bf16 with integer operations: x86 without
    // AVX512-BF16 would call __truncsfbf2, which libgcc before GCC 13 lacks.
    if (failed(runPipeline(
            module,
            "fuse-approximate-math, arith-expand{include-bf16=true}, "
            "convert-scf-to-cf, convert-math-to-llvm, "
            "convert-math-to-libm, "
            "convert-to-llvm, "
            "reconcile-unrealized-casts, canonicalize, cse",
            "llvm-dialect", result)))
      return failure();
    dump("llvm-dialect", module);
    auto start = Clock::now();
    llvm::LLVMContext llvmContext;
    std::unique_ptr<llvm::Module> llvmModule =
        translateModuleToLLVMIR(module, llvmContext);
    if (!llvmModule)
      return module.emitError("translation to LLVM IR failed");
    result.times.push_back({"llvm-ir", millisecondsSince(start)});
    llvm::raw_string_ostream os(result.text);
    llvmModule->print(os, nullptr);
    dump("llvm", result.text, "ll");
    return result;
  }

  if (failed(runPipeline(module,
                         "convert-scf-to-cf, gpu.module(convert-gpu-to-nvvm{"
                         "index-bitwidth=64}, reconcile-unrealized-casts)",
                         "nvvm", result)))
    return failure();
  passTablesByValue(module);
  annotateLoopBranches(module);
  dump("nvvm", module);
  std::string optimizedIR;
  if (failed(emitPTX(module, options, stop, result,
                     dump.enabled() ? &optimizedIR : nullptr)))
    return failure();
  if (stop == Stage::PTX) {
    dump("llvm", optimizedIR, "ll");
    dump("ptx", result.text, "ptx");
  } else {
    dump("llvm", result.text, "ll");
  }
  return result;
}

FailureOr<CompileResult>
tilefuse::compile(ModuleOp module, const CompileOptions &options, Stage stop) {
  StageDumper dump(module, options);
  if (!dump.isUsable())
    return failure();
  FailureOr<CompileResult> result = compileStages(module, options, stop, dump);
  if (!dump.isUsable())
    return failure();
  return result;
}

/// Where `entry`'s header lies in `ptx`: from `.entry <name>(` to its
/// body's `{` (the NVPTX backend prints the performance directives between
/// the parameter list and the body).
static llvm::Expected<std::pair<size_t, size_t>> entryHeader(StringRef ptx,
                                                             StringRef entry) {
  size_t start = ptx.find((".entry " + entry + "(").str());
  if (start == StringRef::npos)
    return llvm::createStringError("no such entry");
  size_t body = ptx.find("\n{", start);
  if (body == StringRef::npos)
    return llvm::createStringError("the entry has no body");
  return std::make_pair(start, body);
}

llvm::Expected<std::string>
tilefuse::withMinBlocksPerSM(StringRef ptx, StringRef entry, int64_t blocks) {
  auto fail = [&](const Twine &why) {
    return llvm::createStringError("cannot ask ptxas for " + Twine(blocks) +
                                   " blocks per SM of " + entry + ": " + why);
  };
  if (blocks < 1)
    return fail("not a block count");
  llvm::Expected<std::pair<size_t, size_t>> found = entryHeader(ptx, entry);
  if (!found)
    return fail(llvm::toString(found.takeError()));
  auto [start, body] = *found;
  StringRef header = ptx.slice(start, body);
  if (header.contains("\n.minnctapersm "))
    return fail("it already asks for some");
  size_t blockSize = header.find("\n.maxntid ");
  if (blockSize == StringRef::npos)
    blockSize = header.find("\n.reqntid ");
  if (blockSize == StringRef::npos)
    return fail("it has no .maxntid or .reqntid");
  size_t lineEnd = header.find('\n', blockSize + 1);
  size_t at = lineEnd == StringRef::npos ? body : start + lineEnd;
  return (ptx.take_front(at) + "\n.minnctapersm " + Twine(blocks) +
          ptx.drop_front(at))
      .str();
}

llvm::Expected<std::string>
tilefuse::withMaxThreads(StringRef ptx, StringRef entry, int64_t threads) {
  auto fail = [&](const Twine &why) {
    return llvm::createStringError("cannot bound " + entry + "'s blocks to " +
                                   Twine(threads) + " threads: " + why);
  };
  if (threads < 1 || threads > 1024)
    return fail("not a block size");
  llvm::Expected<std::pair<size_t, size_t>> found = entryHeader(ptx, entry);
  if (!found)
    return fail(llvm::toString(found.takeError()));
  auto [start, body] = *found;
  StringRef header = ptx.slice(start, body);
  if (header.contains("\n.maxntid ") || header.contains("\n.reqntid "))
    return fail("it has a block size");
  return (ptx.take_front(body) + "\n.maxntid " + Twine(threads) + ", 1, 1" +
          ptx.drop_front(body))
      .str();
}

std::string tilefuse::fingerprint(ModuleOp module) {
  std::string text;
  llvm::raw_string_ostream os(text);
  module->print(os, OpPrintingFlags().printGenericOpForm());
  return llvm::toHex(llvm::SHA256::hash(llvm::arrayRefFromStringRef(text)),
                     /*LowerCase=*/true);
}

static void initializeNativeTarget() {
  static std::once_flag initialized;
  std::call_once(initialized, [] {
    llvm::InitializeNativeTarget();
    llvm::InitializeNativeTargetAsmPrinter();
  });
}

FailureOr<std::unique_ptr<ExecutionEngine>>
tilefuse::jitCompile(ModuleOp module) {
  initializeNativeTarget();
  // The options hold a function_ref: the transformer must outlive create().
  std::function<llvm::Error(llvm::Module *)> optimize =
      makeOptimizingTransformer(/*optLevel=*/3, /*sizeLevel=*/0,
                                /*targetMachine=*/nullptr);
  ExecutionEngineOptions engineOptions;
  engineOptions.transformer = optimize;
  auto engine = ExecutionEngine::create(module, engineOptions);
  if (!engine) {
    std::string message = llvm::toString(engine.takeError());
    return module.emitError("JIT compilation failed: ") << message;
  }
  return std::move(*engine);
}

FailureOr<std::unique_ptr<ExecutionEngine>>
tilefuse::jitCompileLLVMIR(ModuleOp anchor, StringRef ir) {
  initializeNativeTarget();
  std::string parseError;
  auto build = [&](Operation *, llvm::LLVMContext &llvmContext)
      -> std::unique_ptr<llvm::Module> {
    llvm::SMDiagnostic diagnostic;
    auto module = llvm::parseAssemblyString(ir, diagnostic, llvmContext);
    if (!module) {
      llvm::raw_string_ostream os(parseError);
      diagnostic.print("tilefuse", os);
    }
    return module;
  };
  std::function<llvm::Error(llvm::Module *)> optimize =
      makeOptimizingTransformer(/*optLevel=*/3, /*sizeLevel=*/0,
                                /*targetMachine=*/nullptr);
  ExecutionEngineOptions engineOptions;
  engineOptions.llvmModuleBuilder = build;
  engineOptions.transformer = optimize;
  auto engine = ExecutionEngine::create(anchor, engineOptions);
  if (!engine) {
    std::string message = llvm::toString(engine.takeError());
    return anchor.emitError("JIT compilation failed: ")
           << (parseError.empty() ? message : parseError);
  }
  return std::move(*engine);
}

void tilefuse::registerTranslations(DialectRegistry &registry) {
  registerBuiltinDialectTranslation(registry);
  registerGPUDialectTranslation(registry);
  registerLLVMDialectTranslation(registry);
  registerNVVMDialectTranslation(registry);
}
