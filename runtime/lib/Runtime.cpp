//===- Runtime.cpp - compile on first use, cached, then run ---------------===//

#include "tilefuse/Runtime/Runtime.h"
#include "tilefuse/Compiler/Registration.h"

#include "mlir/ExecutionEngine/ExecutionEngine.h"
#include "mlir/IR/Diagnostics.h"
#include "llvm/ADT/StringExtras.h"
#include "llvm/ADT/StringSwitch.h"
#include "llvm/Support/FormatVariadic.h"
#include "llvm/TargetParser/Host.h"

#include <chrono>
#include <cstdlib>

using namespace tilefuse;

CpuKernel::CpuKernel(KernelInfo info,
                     std::unique_ptr<mlir::ExecutionEngine> engine)
    : kernelInfo(std::move(info)), engine(std::move(engine)) {}

CpuKernel::~CpuKernel() = default;

llvm::Error CpuKernel::run(CpuExecutor &executor,
                           llvm::ArrayRef<void *> arguments,
                           int64_t rows) const {
  return executor.run(*engine, kernelInfo, arguments, rows);
}

//===----------------------------------------------------------------------===//
// The CPU artifact: "name n rows_per_task vector_width", one line per port
// ("in|out name kind dtype accumulator"), "---", then the LLVM IR.
//===----------------------------------------------------------------------===//

static const char *kindName(PortInfo::Kind kind) {
  switch (kind) {
  case PortInfo::Kind::Full: return "full";
  case PortInfo::Kind::Row: return "row";
  case PortInfo::Kind::Col: return "col";
  case PortInfo::Kind::Scalar: return "scalar";
  }
  return "?";
}

std::string tilefuse::serializeCpuArtifact(const KernelInfo &info,
                                           llvm::StringRef ir) {
  std::string text;
  llvm::raw_string_ostream os(text);
  os << info.name << " " << info.n << " " << info.tile.rowsPerTask << " "
     << info.tile.vectorWidth << "\n";
  auto ports = [&](const char *direction, const std::vector<PortInfo> &list) {
    for (const PortInfo &port : list)
      os << direction << " " << port.name << " " << kindName(port.kind) << " "
         << port.dtype << " "
         << (port.accumulatorDtype.empty() ? "-" : port.accumulatorDtype)
         << "\n";
  };
  ports("in", info.inputs);
  ports("out", info.outputs);
  os << "---\n" << ir;
  return text;
}

llvm::Expected<std::pair<KernelInfo, std::string>>
tilefuse::deserializeCpuArtifact(llvm::StringRef artifact) {
  auto malformed = [] {
    return llvm::createStringError("malformed CPU kernel artifact");
  };
  size_t separator = artifact.find("\n---\n");
  if (separator == llvm::StringRef::npos)
    return malformed();
  llvm::SmallVector<llvm::StringRef> lines;
  artifact.substr(0, separator).split(lines, '\n');
  KernelInfo info;
  info.tile.target = "cpu";
  llvm::SmallVector<llvm::StringRef> fields;
  lines.front().split(fields, ' ');
  if (fields.size() != 4 || fields[1].getAsInteger(10, info.n) ||
      fields[2].getAsInteger(10, info.tile.rowsPerTask) ||
      fields[3].getAsInteger(10, info.tile.vectorWidth))
    return malformed();
  info.name = fields[0].str();
  for (llvm::StringRef line : llvm::ArrayRef(lines).drop_front()) {
    fields.clear();
    line.split(fields, ' ');
    if (fields.size() != 5)
      return malformed();
    PortInfo port;
    port.name = fields[1].str();
    std::optional<PortInfo::Kind> kind =
        llvm::StringSwitch<std::optional<PortInfo::Kind>>(fields[2])
            .Case("full", PortInfo::Kind::Full)
            .Case("row", PortInfo::Kind::Row)
            .Case("col", PortInfo::Kind::Col)
            .Case("scalar", PortInfo::Kind::Scalar)
            .Default(std::nullopt);
    if (!kind)
      return malformed();
    port.kind = *kind;
    port.dtype = fields[3].str();
    if (fields[4] != "-")
      port.accumulatorDtype = fields[4].str();
    (fields[0] == "in" ? info.inputs : info.outputs).push_back(port);
  }
  return std::make_pair(info, artifact.substr(separator + 5).str());
}

//===----------------------------------------------------------------------===//
// Runtime
//===----------------------------------------------------------------------===//

static mlir::DialectRegistry makeRegistry() {
  mlir::DialectRegistry registry;
  registerAllDialects(registry);
  registerAllPasses();
  return registry;
}

Runtime::Runtime(std::optional<std::string> cacheDirectory)
    : mlirContext(makeRegistry()),
      kernelCache(std::make_unique<KernelCache>(std::move(cacheDirectory))) {
  mlirContext.loadAllAvailableDialects();
  const char *always = std::getenv("TILEFUSE_ALWAYS_COMPILE");
  alwaysCompile = always && llvm::StringRef(always) == "1";
  const char *log = std::getenv("TILEFUSE_LOG");
  logCompiles = log && llvm::StringRef(log).contains("compile");
}

Runtime::~Runtime() = default;

Runtime &Runtime::global() {
  // Never destroyed: objects that outlive static destruction (Python's,
  // above all) still hold IR in its context.
  static Runtime *runtime = new Runtime(KernelCache::defaultDirectory());
  return *runtime;
}

/// Collects the diagnostics emitted while it lives, to return as an error.
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

llvm::Expected<std::shared_ptr<const CpuKernel>>
Runtime::getCpuKernel(mlir::ModuleOp module, const CompileOptions &options) {
  if (options.target != "cpu")
    return llvm::createStringError("getCpuKernel needs target cpu, got " +
                                   options.target);
  CacheKey key;
  key.fingerprint = fingerprint(module);
  key.dtype = options.dtype;
  key.n = options.n;
  key.aligned = options.aligned;
  key.target = "cpu-" + llvm::sys::getHostCPUName().str();
  key.tileConfig = llvm::formatv("{0} {1} {2} {3}", options.threadsPerRow,
                                 options.rowsPerBlock, options.vectorWidth,
                                 options.rowOnChip)
                       .str();
  key.compilerVersion = compilerVersion();
  std::string digest = key.digest();
  if (!alwaysCompile) {
    std::lock_guard<std::mutex> lock(loadedMutex);
    if (auto it = loaded.find(digest); it != loaded.end())
      return it->second;
  }

  auto compileArtifact = [&]() -> llvm::Expected<std::string> {
    DiagnosticCollector diagnostics(mlirContext);
    auto start = std::chrono::steady_clock::now();
    mlir::OwningOpRef<mlir::ModuleOp> copy = module.clone();
    mlir::FailureOr<CompileResult> result =
        compile(*copy, options, Stage::LLVM);
    if (mlir::failed(result))
      return diagnostics.error("compilation failed");
    ++compiles;
    if (logCompiles)
      llvm::errs() << llvm::formatv(
          "tilefuse: compiled {0} (dtype={1} n={2} aligned={3} target=cpu) "
          "key={4} in {5:F1} ms\n",
          result->kernels.front().name, options.dtype, options.n,
          options.aligned, digest.substr(0, 16),
          std::chrono::duration<double, std::milli>(
              std::chrono::steady_clock::now() - start)
              .count());
    return serializeCpuArtifact(result->kernels.front(), result->text);
  };
  auto compileUncached = [&]() -> llvm::Expected<KernelCache::Artifact> {
    llvm::Expected<std::string> text = compileArtifact();
    if (!text)
      return text.takeError();
    return std::make_shared<const std::string>(std::move(*text));
  };
  llvm::Expected<KernelCache::Artifact> artifact =
      alwaysCompile ? compileUncached()
                    : kernelCache->getOrCompile(key, compileArtifact);
  if (!artifact)
    return artifact.takeError();
  auto parsed = deserializeCpuArtifact(**artifact);
  if (!parsed)
    return parsed.takeError();
  DiagnosticCollector diagnostics(mlirContext);
  mlir::OwningOpRef<mlir::ModuleOp> anchor =
      mlir::ModuleOp::create(mlir::UnknownLoc::get(&mlirContext));
  auto engine = jitCompileLLVMIR(*anchor, parsed->second);
  if (mlir::failed(engine))
    return diagnostics.error("loading the kernel failed");
  auto kernel = std::make_shared<const CpuKernel>(std::move(parsed->first),
                                                  std::move(*engine));
  std::lock_guard<std::mutex> lock(loadedMutex);
  return loaded.try_emplace(digest, kernel).first->second;
}
