//===- Runtime.cpp - compile on first use, cached, then run ---------------===//

#include "tilefuse/Runtime/Runtime.h"
#include "tilefuse/Compiler/KernelABI.h"
#include "tilefuse/Compiler/Registration.h"

#include "mlir/ExecutionEngine/ExecutionEngine.h"
#include "mlir/IR/Diagnostics.h"
#include "mlir/IR/SymbolTable.h"
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

llvm::Expected<std::shared_ptr<const CpuKernel>>
CpuKernel::create(KernelInfo info,
                  std::unique_ptr<mlir::ExecutionEngine> engine) {
  std::shared_ptr<CpuKernel> kernel(
      new CpuKernel(std::move(info), std::move(engine)));
  auto main = kernel->engine->lookupPacked(kernel->kernelInfo.name);
  if (!main)
    return main.takeError();
  kernel->kernel = *main;
  if (kernel->kernelInfo.hasColumnReduction()) {
    auto finalize =
        kernel->engine->lookupPacked(kernel->kernelInfo.name + kFinalizeSuffix);
    if (!finalize)
      return finalize.takeError();
    kernel->finalize = *finalize;
  }
  return kernel;
}

llvm::Error CpuKernel::run(CpuExecutor &executor,
                           llvm::ArrayRef<void *> arguments,
                           int64_t rows) const {
  countKernelLaunch();
  return executor.run(kernelInfo, kernel, finalize, arguments, rows);
}

llvm::Error CpuKernel::runMultiTensor(CpuExecutor &executor,
                                      const MultiTensorCall &call) const {
  countKernelLaunch();
  return executor.runMultiTensor(kernelInfo, kernel, call);
}

static std::atomic<int64_t> launches{0};

int64_t tilefuse::kernelLaunches() { return launches.load(); }

void tilefuse::countKernelLaunch() {
  launches.fetch_add(1, std::memory_order_relaxed);
}

//===----------------------------------------------------------------------===//
// An artifact: "name n target threads_per_row rows_per_block vector_width
// chunks row_on_chip blocks_per_sm rows_per_task chunk_elements
// multi_tensor skip_if", one line per port ("in|out name kind dtype
// accumulator binding pointee updates", "-" for an empty field), "---",
// then the LLVM IR (CPU) or the PTX (GPU).
//===----------------------------------------------------------------------===//

static const char *bindingName(PortInfo::Binding binding) {
  switch (binding) {
  case PortInfo::Binding::Value: return "value";
  case PortInfo::Binding::Pointer: return "pointer";
  case PortInfo::Binding::PerTensor: return "per-tensor";
  }
  llvm_unreachable("unknown binding");
}

std::string tilefuse::serializeArtifact(const KernelInfo &info,
                                        llvm::StringRef code) {
  std::string text;
  llvm::raw_string_ostream os(text);
  const TileConfig &tile = info.tile;
  os << info.name << " " << info.n << " " << tile.target << " "
     << tile.threadsPerRow << " " << tile.rowsPerBlock << " "
     << tile.vectorWidth << " " << tile.chunks << " " << tile.rowOnChip << " "
     << tile.blocksPerSM << " " << tile.rowsPerTask << " "
     << tile.chunkElements << " " << tile.stagedChunks << " "
     << tile.stageBytes << " " << tile.partialChunks << " "
     << info.multiTensor << " "
     << (info.skipIf.empty() ? "-" : info.skipIf) << "\n";
  auto field = [](const std::string &text) {
    return text.empty() ? "-" : text;
  };
  auto ports = [&](const char *direction, const std::vector<PortInfo> &list) {
    for (const PortInfo &port : list)
      os << direction << " " << port.name << " " << PortInfo::kindName(port.kind) << " "
         << port.dtype << " " << field(port.accumulatorDtype) << " "
         << bindingName(port.binding) << " " << field(port.pointee) << " "
         << field(port.updates) << "\n";
  };
  ports("in", info.inputs);
  ports("out", info.outputs);
  os << "---\n" << code;
  return text;
}

llvm::Expected<std::pair<KernelInfo, std::string>>
tilefuse::deserializeArtifact(llvm::StringRef artifact) {
  auto malformed = [] {
    return llvm::createStringError("malformed CPU kernel artifact");
  };
  size_t separator = artifact.find("\n---\n");
  if (separator == llvm::StringRef::npos)
    return malformed();
  llvm::SmallVector<llvm::StringRef> lines;
  artifact.substr(0, separator).split(lines, '\n');
  KernelInfo info;
  TileConfig &tile = info.tile;
  llvm::SmallVector<llvm::StringRef> fields;
  lines.front().split(fields, ' ');
  unsigned onChip = 0, multiTensor = 0;
  if (fields.size() != 16 || fields[1].getAsInteger(10, info.n) ||
      fields[3].getAsInteger(10, tile.threadsPerRow) ||
      fields[4].getAsInteger(10, tile.rowsPerBlock) ||
      fields[5].getAsInteger(10, tile.vectorWidth) ||
      fields[6].getAsInteger(10, tile.chunks) ||
      fields[7].getAsInteger(10, onChip) ||
      fields[8].getAsInteger(10, tile.blocksPerSM) ||
      fields[9].getAsInteger(10, tile.rowsPerTask) ||
      fields[10].getAsInteger(10, tile.chunkElements) ||
      fields[11].getAsInteger(10, tile.stagedChunks) ||
      fields[12].getAsInteger(10, tile.stageBytes) ||
      fields[13].getAsInteger(10, tile.partialChunks) ||
      fields[14].getAsInteger(10, multiTensor))
    return malformed();
  info.name = fields[0].str();
  tile.target = fields[2].str();
  tile.rowOnChip = onChip;
  info.multiTensor = multiTensor;
  if (fields[15] != "-")
    info.skipIf = fields[15].str();
  auto optional = [](llvm::StringRef text) {
    return text == "-" ? std::string() : text.str();
  };
  for (llvm::StringRef line : llvm::ArrayRef(lines).drop_front()) {
    fields.clear();
    line.split(fields, ' ');
    if (fields.size() != 8)
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
    port.accumulatorDtype = optional(fields[4]);
    std::optional<PortInfo::Binding> binding =
        llvm::StringSwitch<std::optional<PortInfo::Binding>>(fields[5])
            .Case("value", PortInfo::Binding::Value)
            .Case("pointer", PortInfo::Binding::Pointer)
            .Case("per-tensor", PortInfo::Binding::PerTensor)
            .Default(std::nullopt);
    if (!binding)
      return malformed();
    port.binding = *binding;
    port.pointee = optional(fields[6]);
    port.updates = optional(fields[7]);
    (fields[0] == "in" ? info.inputs : info.outputs).push_back(port);
  }
  return std::make_pair(info, artifact.substr(separator + 5).str());
}

//===----------------------------------------------------------------------===//
// Runtime
//===----------------------------------------------------------------------===//

llvm::Expected<llvm::StringMap<TileOverride>>
tilefuse::parseTileOverrides(llvm::StringRef text) {
  llvm::StringMap<TileOverride> overrides;
  auto malformed = [&](llvm::StringRef entry, llvm::StringRef why) {
    return llvm::createStringError(
        llvm::formatv("TILEFUSE_TILE: '{0}': {1}; expected "
                      "KERNEL:KEY=VALUE[,KEY=VALUE...] entries joined by ';', "
                      "KEY threads-per-row, rows-per-block, vector-width or "
                      "row-on-chip",
                      entry, why)
            .str());
  };
  llvm::SmallVector<llvm::StringRef> entries;
  text.split(entries, ';', -1, /*KeepEmpty=*/false);
  for (llvm::StringRef entry : entries) {
    auto [untrimmed, fields] = entry.trim().split(':');
    llvm::StringRef kernel = untrimmed.trim();
    if (kernel.empty() || fields.empty())
      return malformed(entry, "no kernel name or no override");
    TileOverride &tile = overrides[kernel];
    llvm::SmallVector<llvm::StringRef> pairs;
    fields.split(pairs, ',');
    for (llvm::StringRef pair : pairs) {
      auto [key, value] = pair.trim().split('=');
      if (key == "row-on-chip") {
        if (value != "true" && value != "false" && value != "auto")
          return malformed(entry, "row-on-chip is true, false or auto");
        tile.rowOnChip = value.str();
        continue;
      }
      int64_t *field = llvm::StringSwitch<int64_t *>(key)
                           .Case("threads-per-row", &tile.threadsPerRow)
                           .Case("rows-per-block", &tile.rowsPerBlock)
                           .Case("vector-width", &tile.vectorWidth)
                           .Default(nullptr);
      if (!field)
        return malformed(entry, "unknown key '" + key.str() + "'");
      if (value.getAsInteger(10, *field) || *field <= 0)
        return malformed(entry, key.str() + " is a positive integer");
    }
  }
  return overrides;
}

static mlir::DialectRegistry makeRegistry() {
  mlir::DialectRegistry registry;
  registerAllDialects(registry);
  registerPipelinePasses();
  return registry;
}

Runtime::Runtime(std::optional<std::string> cacheDirectory)
    : mlirContext(makeRegistry()),
      kernelCache(std::make_unique<KernelCache>(std::move(cacheDirectory))) {
  const char *tile = std::getenv("TILEFUSE_TILE");
  if (auto tiles = parseTileOverrides(tile ? tile : ""))
    tileOverrides = std::move(*tiles);
  else
    tileOverrideError = llvm::toString(tiles.takeError());
  mlirContext.loadAllAvailableDialects();
  const char *always = std::getenv("TILEFUSE_ALWAYS_COMPILE");
  alwaysCompile = always && llvm::StringRef(always) == "1";
  if (const char *dump = std::getenv("TILEFUSE_DUMP"))
    dumpDirectory = dump;
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

llvm::Expected<std::optional<CompileOptions>>
Runtime::tileOverride(mlir::ModuleOp module,
                      const CompileOptions &given) const {
  if (!tileOverrideError.empty())
    return llvm::createStringError(tileOverrideError);
  if (tileOverrides.empty() || module.getBody()->empty())
    return std::nullopt;
  auto name = module.getBody()->front().getAttrOfType<mlir::StringAttr>(
      mlir::SymbolTable::getSymbolAttrName());
  auto tile = name ? tileOverrides.find(name.getValue()) : tileOverrides.end();
  if (tile == tileOverrides.end())
    return std::nullopt;
  // Only what the entry names: the caller's other overrides stay.
  CompileOptions options = given;
  const TileOverride &set = tile->second;
  if (set.threadsPerRow)
    options.threadsPerRow = set.threadsPerRow;
  if (set.rowsPerBlock)
    options.rowsPerBlock = set.rowsPerBlock;
  if (set.vectorWidth)
    options.vectorWidth = set.vectorWidth;
  if (set.rowOnChip != "auto")
    options.rowOnChip = set.rowOnChip;
  return options;
}

CacheKey Runtime::keyFor(mlir::ModuleOp module, const CompileOptions &options) {
  CacheKey key;
  key.fingerprint = fingerprint(module);
  key.dtype = options.dtype;
  key.n = options.n;
  key.aligned = options.aligned;
  key.target = options.target == "cpu"
                   ? "cpu-" + llvm::sys::getHostCPUName().str()
                   : options.target;
  key.tileConfig = llvm::formatv("{0} {1} {2} {3}", options.threadsPerRow,
                                 options.rowsPerBlock, options.vectorWidth,
                                 options.rowOnChip)
                       .str();
  key.abi = options.abi.str();
  key.compilerVersion = compilerVersion();
  return key;
}

llvm::Expected<std::pair<KernelInfo, std::string>>
Runtime::artifactFor(mlir::ModuleOp module, const CompileOptions &options,
                     const CacheKey &key) {
  bool gpu = options.target != "cpu";
  auto compileArtifact = [&]() -> llvm::Expected<std::string> {
    DiagnosticCollector diagnostics(mlirContext);
    auto start = std::chrono::steady_clock::now();
    mlir::OwningOpRef<mlir::ModuleOp> copy = module.clone();
    CompileOptions dumping = options;
    dumping.dumpDirectory = dumpDirectory;
    mlir::FailureOr<CompileResult> result =
        compile(*copy, dumping, gpu ? Stage::PTX : Stage::LLVM);
    if (mlir::failed(result))
      return diagnostics.error("compilation failed");
    ++compiles;
    if (logCompiles)
      llvm::errs() << llvm::formatv(
          "tilefuse: compiled {0} (dtype={1} n={2} aligned={3} target={4}) "
          "key={5} in {6:F1} ms\n",
          result->kernels.front().name, options.dtype, options.n,
          options.aligned, options.target, key.digest().substr(0, 16),
          std::chrono::duration<double, std::milli>(
              std::chrono::steady_clock::now() - start)
              .count());
    return serializeArtifact(result->kernels.front(), result->text);
  };
  if (alwaysCompile) {
    llvm::Expected<std::string> text = compileArtifact();
    if (!text)
      return text.takeError();
    return deserializeArtifact(*text);
  }
  llvm::Expected<KernelCache::Artifact> cached =
      kernelCache->getOrCompile(key, compileArtifact);
  if (!cached)
    return cached.takeError();
  auto parsed = deserializeArtifact(**cached);
  if (parsed)
    return parsed;
  // A whole entry this runtime cannot read: replace it.
  llvm::consumeError(parsed.takeError());
  kernelCache->erase(key);
  cached = kernelCache->getOrCompile(key, compileArtifact);
  if (!cached)
    return cached.takeError();
  return deserializeArtifact(**cached);
}

llvm::Expected<std::shared_ptr<const CpuKernel>>
Runtime::getCpuKernel(mlir::ModuleOp module, const CompileOptions &options) {
  if (options.target != "cpu")
    return llvm::createStringError("getCpuKernel needs target cpu, got " +
                                   options.target);
  auto overridden = tileOverride(module, options);
  if (!overridden)
    return overridden.takeError();
  const CompileOptions &tiled = *overridden ? **overridden : options;
  CacheKey key = keyFor(module, tiled);
  std::string digest = key.digest();
  if (!alwaysCompile) {
    std::lock_guard<std::mutex> lock(loadedMutex);
    if (auto it = loaded.find(digest); it != loaded.end())
      return it->second;
  }
  auto parsed = artifactFor(module, tiled, key);
  if (!parsed)
    return parsed.takeError();
  DiagnosticCollector diagnostics(mlirContext);
  mlir::OwningOpRef<mlir::ModuleOp> anchor =
      mlir::ModuleOp::create(mlir::UnknownLoc::get(&mlirContext));
  auto engine = jitCompileLLVMIR(*anchor, parsed->second);
  if (mlir::failed(engine))
    return diagnostics.error("loading the kernel failed");
  auto kernel = CpuKernel::create(std::move(parsed->first), std::move(*engine));
  if (!kernel)
    return kernel.takeError();
  std::lock_guard<std::mutex> lock(loadedMutex);
  return loaded.try_emplace(digest, *kernel).first->second;
}

llvm::Expected<std::shared_ptr<const GpuKernel>>
Runtime::getGpuKernel(mlir::ModuleOp module, const CompileOptions &options) {
  if (options.target == "cpu" || !isKnownTarget(options.target))
    return llvm::createStringError("getGpuKernel needs a GPU target (sm_80, "
                                   "sm_86, sm_89, sm_90), got " +
                                   options.target);
  auto overridden = tileOverride(module, options);
  if (!overridden)
    return overridden.takeError();
  const CompileOptions &tiled = *overridden ? **overridden : options;
  CacheKey key = keyFor(module, tiled);
  std::string digest = key.digest();
  if (!alwaysCompile) {
    std::lock_guard<std::mutex> lock(loadedMutex);
    if (auto it = loadedGpu.find(digest); it != loadedGpu.end())
      return it->second;
  }
  auto parsed = artifactFor(module, tiled, key);
  if (!parsed)
    return parsed.takeError();
  auto kernel = std::make_shared<const GpuKernel>(
      GpuKernel{std::move(parsed->first), std::move(parsed->second)});
  std::lock_guard<std::mutex> lock(loadedMutex);
  return loadedGpu.try_emplace(digest, kernel).first->second;
}
