//===- traffic.cpp - emulated traffic and an H200 model -------------------===//
//
// For each built-in at bf16 and f32 and each row length n: compile it for
// sm_90, ask `ptxas -v` for its registers, run it in the PTX emulator
// through CudaDriver on a scaled-down launch whose every block does what a
// block of the modeled launch (--rows rows on 132 SMs) does, and print per
// kernel: global bytes per row against the ideal, passes over the row,
// thread-instructions per ideal byte, registers, blocks per SM, and the
// fraction of H200 HBM bandwidth the model in benchmarks/README.md
// estimates. `--json=FILE` writes every number.
//
//===----------------------------------------------------------------------===//

#include "tilefuse/Compiler/Differentiate.h"
#include "tilefuse/Compiler/KernelABI.h"
#include "tilefuse/Emulator/Emulator.h"
#include "tilefuse/Kernels/Builtins.h"
#include "tilefuse/Runtime/CudaDriver.h"

#include "llvm/ADT/StringExtras.h"
#include "llvm/Support/CommandLine.h"
#include "llvm/Support/FileSystem.h"
#include "llvm/Support/FormatVariadic.h"
#include "llvm/Support/JSON.h"
#include "llvm/Support/MemoryBuffer.h"
#include "llvm/Support/Program.h"
#include "llvm/Support/Regex.h"
#include "llvm/Support/raw_ostream.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <random>

using namespace tilefuse;
namespace cl = llvm::cl;
namespace emu = tilefuse::emulator;
using Kind = PortInfo::Kind;

static cl::opt<int64_t> modelRows("rows",
                                  cl::desc("Rows of the modeled launch"),
                                  cl::init(8192));
static cl::list<std::string> kernelNames("kernels", cl::CommaSeparated,
                                         cl::desc("Built-ins (default: all)"));
static cl::list<std::string> dtypeNames("dtypes", cl::CommaSeparated,
                                        cl::desc("Storage dtypes (default: "
                                                 "bf16,f32)"));
static cl::list<int64_t> lengths("n", cl::CommaSeparated,
                                 cl::desc("Row lengths (default: 1000,4096,"
                                          "8192,32000,128256,262144)"));
static cl::opt<bool> derived(
    "derived",
    cl::desc("Also measure, after each hand-written backward built-in, the "
             "backward fuse-differentiate derives from its forward ('<name> "
             "(derived)')"));
static cl::opt<std::string> jsonPath("json", cl::desc("Write results as JSON"),
                                     cl::init(""));

//===----------------------------------------------------------------------===//
// The H200 model (benchmarks/README.md explains each term)
//===----------------------------------------------------------------------===//

namespace h200 {
constexpr double kPeakBytesPerSecond = 4.8e12;
constexpr int kSMs = 132;
constexpr int kRegistersPerSM = 65536;
constexpr int kThreadsPerSM = 2048;
constexpr double kL2Bytes = 50.0 * 1024 * 1024;
constexpr double kClock = 1.98e9; // boost clock
// Thread-operations per clock per SM, per pipe.
constexpr double kIssueLanes = 128; // 4 schedulers x one warp-instruction
constexpr double kSfuLanes = 16;    // ex2, lg2, rsqrt, rcp, sqrt .approx
constexpr double kF64Lanes = 64;
constexpr double kMemoryLanes = 32; // load/store units
/// An IEEE div/sqrt/rcp is an SFU seed refined by ~8 FMA-class
/// instructions on the GPU (ptxas expands it).
constexpr double kDivisionIssue = 9;
/// Bytes of loads in flight per SM that sustain the peak (Little's law);
/// the latency this implies, 32 KiB x 132 / 4.8 TB/s = 0.9 us, is the
/// model's loaded memory latency.
constexpr double kInFlightPerSM = 32 * 1024;
constexpr double kLatency = kInFlightPerSM * kSMs / kPeakBytesPerSecond;
constexpr double kSchedulers = 4;
/// What a round trip costs a block whose warps meet at a barrier before its
/// next loads (a row's reduction across warps): fitted to the backward
/// norms timed on an H200 (benchmarks/README.md). Their loads leave in a
/// burst and the last one arrives late; the shuffles and barriers after it
/// are a chain of latencies the instruction count does not see.
constexpr double kSynchronizedRoundTrip = 1.7e-6;
} // namespace h200

/// Seconds one block of `launch` takes, as the emulator ran it: per round
/// trip to memory, the latency, then the instructions that use the loads.
/// Round trips a barrier separates (the fraction its threads' barriers
/// cover) cost kSynchronizedRoundTrip and the issue of all the warps that
/// meet at the barrier (each scheduler issues their instructions one after
/// another: the block's, or a named barrier's group); the others cost
/// kLatency and the warp's own issue (other warps overlap it). The
/// resident blocks, and the groups of a block that meet at their own
/// barriers, overlap one another, not a group its own phases.
static double roundTripSeconds(const emu::LaunchRecord &launch) {
  double blocks = double(launch.grid[0]) * launch.grid[1] * launch.grid[2];
  double threads =
      blocks * launch.block[0] * launch.block[1] * launch.block[2];
  double roundTrips = double(launch.loadRoundTrips) / threads;
  if (roundTrips == 0)
    return 0;
  double issueSeconds = double(launch.totalInstructions()) / threads /
                        roundTrips / h200::kClock;
  double meeting = launch.barriers
                       ? double(launch.barrierThreads) / launch.barriers
                       : threads / blocks;
  double warpsPerScheduler =
      std::ceil(std::ceil(meeting / 32.0) / h200::kSchedulers);
  double synchronized =
      std::min(1.0, double(launch.barrierThreads) / threads / roundTrips);
  return roundTrips *
         (synchronized * (h200::kSynchronizedRoundTrip +
                          warpsPerScheduler * issueSeconds) +
          (1 - synchronized) * (h200::kLatency + issueSeconds));
}

//===----------------------------------------------------------------------===//
// ptxas -v
//===----------------------------------------------------------------------===//

struct PtxasReport {
  std::map<std::string, int> registers; // per entry function
  std::map<std::string, int> spills;    // bytes of spill stores
  std::map<std::string, int> stack;     // bytes of local memory
};

static llvm::Expected<PtxasReport> ptxasReport(const std::string &ptx) {
  const char *cuda = std::getenv("CUDA_PATH");
  std::string ptxas =
      std::string(cuda ? cuda : "/usr/local/cuda") + "/bin/ptxas";
  if (!llvm::sys::fs::exists(ptxas))
    return llvm::createStringError("ptxas not found at " + ptxas +
                                   " (set CUDA_PATH)");
  llvm::SmallString<128> input, output;
  llvm::sys::fs::createTemporaryFile("tilefuse-traffic", "ptx", input);
  llvm::sys::fs::createTemporaryFile("tilefuse-traffic", "log", output);
  {
    std::error_code error;
    llvm::raw_fd_ostream file(input, error);
    file << ptx;
  }
  llvm::StringRef arguments[] = {ptxas, "-arch=sm_90", "-v", input, "-o",
                                 "/dev/null"};
  std::optional<llvm::StringRef> redirects[] = {std::nullopt, output, output};
  std::string error;
  int status = llvm::sys::ExecuteAndWait(ptxas, arguments, std::nullopt,
                                         redirects, 0, 0, &error);
  auto log = llvm::MemoryBuffer::getFile(output);
  llvm::sys::fs::remove(input);
  llvm::sys::fs::remove(output);
  if (status != 0 || !log)
    return llvm::createStringError("ptxas failed: " + error +
                                   (log ? (*log)->getBuffer().str() : ""));
  PtxasReport report;
  std::string function;
  llvm::SmallVector<llvm::StringRef> lines;
  (*log)->getBuffer().split(lines, '\n');
  llvm::Regex entry("Compiling entry function '([^']+)'"),
      used("Used ([0-9]+) registers"), spill("([0-9]+) bytes spill stores"),
      stack("([0-9]+) bytes stack frame");
  for (llvm::StringRef line : lines) {
    llvm::SmallVector<llvm::StringRef, 2> match;
    if (entry.match(line, &match))
      function = match[1].str();
    else if (used.match(line, &match))
      report.registers[function] = std::stoi(match[1].str());
    if (spill.match(line, &match))
      report.spills[function] = std::stoi(match[1].str());
    if (stack.match(line, &match))
      report.stack[function] = std::stoi(match[1].str());
  }
  return report;
}

//===----------------------------------------------------------------------===//
// One kernel, emulated
//===----------------------------------------------------------------------===//

/// Host memory for one tensor, 64-byte aligned.
struct HostTensor {
  std::vector<uint8_t> storage;
  void *data = nullptr;
  size_t bytes = 0;
  void allocate(size_t size) {
    storage.assign(size + 64, 0);
    auto address = reinterpret_cast<uintptr_t>(storage.data());
    data = storage.data() + (64 - address % 64) % 64;
    bytes = size;
  }
};

/// Values in [0.5, 1.5) in `dtype` (statistics and second moments stay
/// positive; no NaN takes another path).
static void fill(HostTensor &tensor, const std::string &dtype,
                 std::mt19937 &rng) {
  std::uniform_real_distribution<float> uniform(0.5f, 1.5f);
  size_t count = tensor.bytes / dtypeBytes(dtype);
  auto *bytes = static_cast<uint8_t *>(tensor.data);
  for (size_t i = 0; i < count; ++i) {
    float value = uniform(rng);
    uint32_t bits;
    std::memcpy(&bits, &value, 4);
    if (dtype == "f32") {
      std::memcpy(bytes + 4 * i, &bits, 4);
    } else if (dtype == "f64") {
      double wide = value;
      std::memcpy(bytes + 8 * i, &wide, 8);
    } else if (dtype == "bf16") {
      uint16_t half = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16;
      std::memcpy(bytes + 2 * i, &half, 2);
    } else {
      _Float16 half = static_cast<_Float16>(value);
      std::memcpy(bytes + 2 * i, &half, 2);
    }
  }
}

struct Result {
  std::string kernel, dtype;
  int64_t n = 0, modelRows = 0, emulatedRows = 0;
  TileConfig tile;
  int registers = 0, finalizeRegisters = 0, spills = 0, blocksPerSM = 0;
  /// Where CudaDriver loaded the PTX that asks for more blocks per SM: the
  /// registers without asking (0 otherwise).
  int unaskedRegisters = 0;
  double inFlightPerSM = 0; // bytes of loads in flight, main kernel
  int64_t grid = 0; // of the modeled launch
  int64_t threadsPerBlock = 0; // launched (a folded block's, TileConfig.h)
  double bytesPerRow = 0, idealPerRow = 0, passes = 0;
  double instructionsPerIdealByte = 0, hbmBytesPerRow = 0, fraction = 0;
  std::string limit;
  std::map<std::string, double> perBufferBytesPerRow;
  uint64_t emulatedInstructions = 0;
  double emulatedSeconds = 0;
};

constexpr llvm::StringLiteral kDerivedSuffix = " (derived)";

/// The built-in `name`, or for "<name>_bwd (derived)" the backward derived
/// from the built-in <name>_fwd for the gradient of its first output, as
/// the hand-written backward takes it.
static mlir::FailureOr<mlir::OwningOpRef<mlir::ModuleOp>>
buildKernel(mlir::MLIRContext &context, llvm::StringRef name) {
  if (!name.consume_back(kDerivedSuffix))
    return kernels::buildBuiltin(context, name);
  name.consume_back("_bwd");
  auto forward = kernels::buildBuiltin(context, (name + "_fwd").str());
  if (mlir::failed(forward))
    return mlir::failure();
  auto kernel = *(*forward)->getOps<fuse::KernelOp>().begin();
  DifferentiateOptions options;
  options.outputs = {
      mlir::cast<mlir::StringAttr>(kernel.getOutputNames()[0]).str()};
  auto module = mlir::OwningOpRef<mlir::ModuleOp>(
      mlir::ModuleOp::create(kernel.getLoc()));
  mlir::OpBuilder builder = mlir::OpBuilder::atBlockEnd(module->getBody());
  mlir::FailureOr<Derivative> derivative =
      differentiate(kernel, options, builder);
  if (mlir::failed(derivative))
    return mlir::failure();
  derivative->forward.erase();
  return module;
}

static llvm::Expected<Result> measure(Runtime &runtime, llvm::StringRef name,
                                      const std::string &dtype, int64_t n) {
  Result result;
  result.kernel = name.str();
  result.dtype = dtype;
  result.n = n;
  auto module = buildKernel(runtime.context(), name);
  if (mlir::failed(module))
    return llvm::createStringError("cannot build " + name.str());
  CompileOptions options;
  options.dtype = dtype;
  options.n = n;
  options.target = "sm_90";
  auto compiled = runtime.getGpuKernel(**module, options);
  if (!compiled)
    return compiled.takeError();
  std::shared_ptr<const GpuKernel> kernel = *compiled;
  const KernelInfo &info = kernel->info;
  const TileConfig &tile = info.tile;
  result.tile = tile;
  llvm::Expected<PtxasReport> report = ptxasReport(kernel->ptx);
  if (!report)
    return report.takeError();
  // Where fewer blocks fit than blocksPerSMGoal, CudaDriver loads the PTX
  // again asking ptxas for more (CudaDriver::raiseOccupancy): what ptxas
  // does for each count it may ask for.
  // What ptxas does with a variant of the PTX the runtime may load, by key.
  auto addReport = [](std::map<unsigned, PtxasReport> &reports, unsigned key,
                      llvm::Expected<std::string> ptx) -> llvm::Error {
    if (!ptx)
      return ptx.takeError();
    llvm::Expected<PtxasReport> variant = ptxasReport(*ptx);
    if (!variant)
      return variant.takeError();
    reports[key] = std::move(*variant);
    return llvm::Error::success();
  };
  std::map<unsigned, PtxasReport> asked;
  int64_t goal = blocksPerSMGoal(tile);
  bool mayAsk =
      goal > 0 && emu::residentBlocks(tile.threadsPerBlock(),
                                      report->registers[info.name], 0) < goal;
  for (int64_t ask = 2; mayAsk && ask <= goal; ++ask)
    if (llvm::Error error = addReport(
            asked, ask, withMinBlocksPerSM(kernel->ptx, info.name, ask)))
      return std::move(error);
  // Where the blocks of a persistent grid that share an SM may fold into
  // one, CudaDriver loads the PTX again with each block size it may try
  // (CudaDriver::foldResidentBlocks; the tile's own where no plain block
  // fits).
  std::map<unsigned, PtxasReport> bounded;
  if (foldsResidentBlocks(tile))
    for (int64_t fold = 1; fold <= maxFoldedBlocks(tile); ++fold) {
      int64_t threads = tile.threadsPerBlock() * fold;
      if (llvm::Error error =
              addReport(bounded, threads,
                        withMaxThreads(kernel->ptx, info.name, threads)))
        return std::move(error);
    }
  // The occupancy the driver reports (and a persistent grid's size) counts
  // them.
  for (auto &[function, registers] : report->registers) {
    auto allocations = [&](std::map<unsigned, PtxasReport> &reports) {
      std::map<unsigned, emu::PtxasAllocation> byKey;
      for (auto &[key, variant] : reports)
        byKey[key] = {variant.registers[function], variant.stack[function]};
      return byKey;
    };
    emu::setRegisters(function, {registers, report->stack[function]},
                      allocations(asked), allocations(bounded));
  }

  // The emulated launch: every block does what a block of the modeled one
  // does. A persistent grid (column reductions) gets one SM and a 132nd of
  // the rows; other kernels run two full blocks.
  bool persistent = tile.blocksPerSM > 0;
  int sms = persistent ? 1 : h200::kSMs;
  int64_t rows = persistent ? std::max<int64_t>(1, modelRows / h200::kSMs)
                            : 2 * tile.rowsPerBlock;
  int64_t fullRows = persistent ? rows * h200::kSMs : modelRows;
  double scale = double(fullRows) / rows;
  result.modelRows = fullRows;
  result.emulatedRows = rows;
  if (!emu::setDevice("sm_90", sms))
    return llvm::createStringError("the emulator has no sm_90");
  auto driver = CudaDriver::load(TILEFUSE_EMULATOR_LIBRARY);
  if (!driver)
    return driver.takeError();
  // From here on no driver call may fail (checked after the launch): the
  // runtime recovers from a second PTX JIT that fails (when partialRows or
  // the launch first loads the kernel) by keeping the plain module, which
  // the table would report as if asking had not helped.
  emu::takeFailedCalls();

  // Buffers, described to the emulator.
  std::mt19937 rng(n);
  std::vector<HostTensor> tensors(info.inputs.size() + info.outputs.size());
  std::vector<int64_t> scalars(info.inputs.size());
  std::vector<void *> arguments;
  std::vector<CudaDriver::Buffer> extents;
  auto elements = [&](Kind kind) -> int64_t {
    return kind == Kind::Full ? rows * n : kind == Kind::Row ? rows : n;
  };
  for (size_t i = 0; i < info.inputs.size(); ++i) {
    const PortInfo &port = info.inputs[i];
    if (port.kind == Kind::Scalar) {
      // Floats as f32 bits (the built-ins' scalars at f32 compute);
      // ignore_index -100; step 1; 1 / softcap beside softcap.
      float value = port.name == "step"                 ? 1.0f
                    : port.name == "softcap_reciprocal" ? 1e3f
                                                        : 1e-3f;
      if (port.dtype == "i64")
        scalars[i] = -100;
      else
        std::memcpy(&scalars[i], &value, 4);
      arguments.push_back(&scalars[i]);
      extents.push_back({port.name.c_str(), nullptr, 0});
      continue;
    }
    HostTensor &tensor = tensors[i];
    tensor.allocate(elements(port.kind) * dtypeBytes(port.dtype));
    if (port.dtype == "i64") {
      for (int64_t r = 0; r < rows; ++r) {
        int64_t target = (r * 7919) % n;
        std::memcpy(static_cast<uint8_t *>(tensor.data) + 8 * r, &target, 8);
      }
    } else {
      fill(tensor, port.dtype, rng);
    }
    arguments.push_back(tensor.data);
    extents.push_back({port.name.c_str(), tensor.data, tensor.bytes});
  }
  for (size_t o = 0; o < info.outputs.size(); ++o) {
    const PortInfo &port = info.outputs[o];
    HostTensor &tensor = tensors[info.inputs.size() + o];
    tensor.allocate(elements(port.kind) * dtypeBytes(port.dtype));
    arguments.push_back(tensor.data);
    extents.push_back({port.name.c_str(), tensor.data, tensor.bytes});
  }
  llvm::Expected<int64_t> groups = (*driver)->partialRows(kernel, rows, 0);
  if (!groups)
    return groups.takeError();
  std::vector<HostTensor> partials;
  std::vector<std::string> partialNames;
  std::vector<void *> workspaces;
  for (const PortInfo &port : info.outputs)
    if (port.kind == Kind::Col) {
      partials.emplace_back();
      partials.back().allocate(std::max<int64_t>(*groups, 1) * n *
                               dtypeBytes(port.accumulatorDtype));
      partialNames.push_back(port.name + " (partials)");
    }
  for (size_t i = 0; i < partials.size(); ++i) {
    workspaces.push_back(partials[i].data);
    extents.push_back(
        {partialNames[i].c_str(), partials[i].data, partials[i].bytes});
  }
  emu::takeLaunches();
  if (llvm::Error error = (*driver)->launch(kernel, arguments, workspaces, rows,
                                            0, nullptr, extents))
    return std::move(error);
  std::vector<emu::LaunchRecord> launches = emu::takeLaunches();
  if (std::vector<std::string> failed = emu::takeFailedCalls(); !failed.empty())
    return llvm::createStringError("a driver call failed: " + failed.front());
  if (launches.empty())
    return llvm::createStringError("no launch recorded");
  auto askedLoaded = asked.find(launches[0].minBlocksPerSM);
  if (goal > 0 && launches[0].minBlocksPerSM > 0 && askedLoaded == asked.end())
    return llvm::createStringError(
        "the runtime kept a module asking for " +
        std::to_string(launches[0].minBlocksPerSM) +
        " blocks per SM, which ptxas was not asked for");
  bool keptAsked = askedLoaded != asked.end();
  auto boundedLoaded = bounded.find(launches[0].block[0]);
  const PtxasReport &loaded = keptAsked ? askedLoaded->second
                              : boundedLoaded != bounded.end()
                                  ? boundedLoaded->second
                                  : *report;
  result.registers = loaded.registers.at(info.name);
  if (keptAsked || boundedLoaded != bounded.end())
    result.unaskedRegisters = report->registers[info.name];
  result.finalizeRegisters =
      report->registers[info.name + std::string(kFinalizeSuffix)];
  for (auto &[function, bytes] : loaded.spills)
    result.spills += bytes;
  // The finalize again, over the partials of the whole modeled launch (the
  // miniature's are one SM's): its loads in flight depend on how many
  // partial rows each of its threads combines.
  if (!partials.empty()) {
    int64_t modelPartialRows = *groups * h200::kSMs;
    std::vector<HostTensor> fullPartials(partials.size());
    std::vector<void *> fullWorkspaces, columnOutputs;
    std::vector<CudaDriver::Buffer> finalizeExtents;
    for (size_t i = 0; i < partials.size(); ++i) {
      fullPartials[i].allocate(partials[i].bytes * h200::kSMs);
      fullWorkspaces.push_back(fullPartials[i].data);
      finalizeExtents.push_back({partialNames[i].c_str(), fullPartials[i].data,
                                 fullPartials[i].bytes});
    }
    for (size_t o = 0; o < info.outputs.size(); ++o)
      if (info.outputs[o].kind == Kind::Col) {
        columnOutputs.push_back(arguments[info.inputs.size() + o]);
        finalizeExtents.push_back(extents[info.inputs.size() + o]);
      }
    if (llvm::Error error = (*driver)->launchFinalize(
            kernel, fullWorkspaces, columnOutputs, modelPartialRows, fullRows,
            0, nullptr, finalizeExtents))
      return std::move(error);
    launches[1] = emu::takeLaunches().at(0);
  }

  // What each buffer is.
  std::map<std::string, const PortInfo *> ports;
  for (const PortInfo &port : info.inputs)
    ports[port.name] = &port;
  for (const PortInfo &port : info.outputs)
    ports[port.name] = &port;
  auto isInput = [&](const std::string &name) {
    return llvm::any_of(info.inputs,
                        [&](const PortInfo &p) { return p.name == name; });
  };

  // The ideal: full tensors once, per-row values once, per-column inputs
  // once per block, per-column outputs once.
  // A persistent grid: the blocks the emulated SM got, on every SM.
  result.threadsPerBlock = launches[0].block[0];
  int64_t rowsPerBlock = launches[0].block[0] / tile.threadsPerRow;
  int64_t modelGrid = (fullRows + rowsPerBlock - 1) / rowsPerBlock;
  if (persistent)
    modelGrid = std::min<int64_t>(modelGrid, launches[0].grid[0] * h200::kSMs);
  result.grid = modelGrid;
  // `essential` counts per-column inputs once per launch instead: the
  // least HBM traffic there is, the numerator of the bandwidth fraction.
  double ideal = 0, essential = 0, idealFullInputs = 0;
  for (const PortInfo *port : llvm::make_second_range(ports)) {
    if (port->kind == Kind::Scalar)
      continue;
    double bytes = dtypeBytes(port->dtype);
    bool input = isInput(port->name);
    switch (port->kind) {
    case Kind::Full:
      ideal += n * bytes;
      essential += n * bytes;
      if (input)
        idealFullInputs += n * bytes;
      break;
    case Kind::Row:
      ideal += bytes;
      essential += bytes;
      break;
    case Kind::Col:
      ideal += input ? n * bytes * modelGrid / double(fullRows)
                     : n * bytes / double(fullRows);
      essential += n * bytes / double(fullRows);
      break;
    default: break;
    }
  }
  result.idealPerRow = ideal;

  // Measured, scaled to the modeled launch, per row.
  // A persistent grid runs at most the tile's blocks per SM (CudaDriver).
  int occupancy = emu::residentBlocks(launches[0].block[0], result.registers,
                                      launches[0].sharedBytes);
  if (occupancy == 0)
    return llvm::createStringError(
        "no block of " + name.str() + " fits on an SM (" +
        std::to_string(result.registers) + " registers, " +
        std::to_string(launches[0].sharedBytes) + " bytes of shared memory)");
  if (persistent)
    occupancy = std::min<int>(occupancy, launches[0].grid[0]);
  result.blocksPerSM = occupancy;
  int64_t resident =
      std::min<int64_t>(modelGrid, int64_t(occupancy) * h200::kSMs);
  double bytes = 0, hbm = 0, fullInputLoads = 0, seconds = 0, slowest = 0;
  double instructions = 0;
  for (size_t l = 0; l < launches.size(); ++l) {
    const emu::LaunchRecord &launch = launches[l];
    // The finalize ran at the modeled size; the main kernel in miniature.
    bool finalize = l > 0;
    double launchScale = finalize ? 1.0 : scale;
    int64_t grid = finalize ? launch.grid[0] : modelGrid;
    double launchBytes = 0, launchHbm = 0, privateWorkingSet = 0;
    struct Share {
      double requested, unique;
      bool shared;
    };
    std::vector<Share> shares;
    for (const emu::BufferTraffic &buffer : launch.buffers) {
      auto port = ports.find(buffer.name);
      bool columnInput = port != ports.end() &&
                         port->second->kind == Kind::Col && !finalize &&
                         isInput(buffer.name);
      bool perRow = port != ports.end() && port->second->kind == Kind::Row;
      double factor = launchScale;
      // What a block asks for: every access to full tensors and partials
      // (a second pass counts again); the sectors it touches of per-column
      // inputs and per-row values (each thread of a row may read them).
      double requested =
          (columnInput || perRow ? buffer.blockUniqueBytes
                                 : buffer.loadedBytes + buffer.storedBytes) *
          factor;
      double unique = columnInput ? buffer.launchUniqueBytes
                                  : buffer.launchUniqueBytes * factor;
      // Shared by the blocks (per-column inputs: every block reads all of
      // it), or each block's own slice.
      double touched = double(buffer.blockUniqueBytes) * factor;
      bool shared = 2 * unique < touched;
      double perBlock = double(buffer.blockUniqueBytes) / launch.grid[0];
      launchBytes += requested;
      shares.push_back({requested, unique, shared});
      if (!shared)
        privateWorkingSet += std::min(unique, resident * perBlock);
      if (!finalize && port != ports.end() &&
          port->second->kind == Kind::Full && isInput(buffer.name))
        fullInputLoads += buffer.loadedBytes;
      result.perBufferBytesPerRow[buffer.name] += requested / fullRows;
    }
    // HBM: each byte once; a re-read again when it misses in the L2. Data
    // the blocks share is re-read soon by another block: it misses only
    // if it does not fit. A block's own slice (a row read in two passes,
    // partials read-modify-written) is re-read after the resident blocks
    // moved their slices: it misses when those do not fit.
    bool privateSpills = privateWorkingSet > h200::kL2Bytes;
    for (const Share &share : shares) {
      bool misses =
          share.shared ? share.unique > h200::kL2Bytes : privateSpills;
      launchHbm += share.unique +
                   (misses ? std::max(0.0, share.requested - share.unique) : 0);
    }
    // Issue: thread-operations per pipe over the SMs that have blocks.
    auto count = [&](emu::InstructionClass kind) {
      return double(launch.instructions[size_t(kind)]) * launchScale;
    };
    double all = double(launch.totalInstructions()) * launchScale;
    double division = count(emu::InstructionClass::Division);
    double issue =
        (all + division * (h200::kDivisionIssue - 1)) / h200::kIssueLanes;
    double sfu = (count(emu::InstructionClass::Transcendental) + division) /
                 h200::kSfuLanes;
    double f64 = count(emu::InstructionClass::Double) / h200::kF64Lanes;
    double memory = count(emu::InstructionClass::Memory) / h200::kMemoryLanes;
    double active = std::min<double>(h200::kSMs, grid);
    double issueSeconds =
        std::max({issue, sfu, f64, memory}) / (active * h200::kClock);
    double memorySeconds =
        launchHbm / (h200::kPeakBytesPerSecond * active / h200::kSMs);
    // Latency: each SM keeps its threads' bytes per round trip in flight.
    double loaded = 0;
    for (const emu::BufferTraffic &buffer : launch.buffers)
      loaded += buffer.loadedBytes;
    int launchOccupancy =
        finalize ? emu::residentBlocks(launch.block[0], result.finalizeRegisters,
                               launch.sharedBytes)
                 : occupancy;
    double threadsPerSM =
        double(launch.block[0]) *
        std::min<double>(launchOccupancy, std::ceil(double(grid) / active));
    double inFlight = launch.loadRoundTrips
                          ? loaded / launch.loadRoundTrips * threadsPerSM
                          : h200::kInFlightPerSM;
    if (!finalize)
      result.inFlightPerSM = inFlight;
    double latencySeconds =
        roundTripSeconds(launch) *
        std::ceil(double(grid) / (active * std::max(1, launchOccupancy)));
    double launchSeconds =
        std::max({issueSeconds, memorySeconds, latencySeconds});
    seconds += launchSeconds;
    // What bounds the launch that takes longest.
    if (launchSeconds > slowest) {
      slowest = launchSeconds;
      std::string what =
          latencySeconds > std::max(memorySeconds, issueSeconds) ? "latency"
          : memorySeconds >= issueSeconds                          ? "HBM"
          : sfu >= issue && sfu >= memory                          ? "SFU"
          : memory >= issue                                        ? "LSU"
                                                                   : "issue";
      if (active < h200::kSMs)
        what += llvm::formatv(", {0} blocks", grid).str();
      result.limit = (finalize ? "finalize: " : "") + what;
    }
    bytes += launchBytes;
    hbm += launchHbm;
    instructions += launch.totalInstructions() * launchScale;
    result.emulatedInstructions += launch.totalInstructions();
    result.emulatedSeconds += launch.seconds;
  }
  result.bytesPerRow = bytes / fullRows;
  result.hbmBytesPerRow = hbm / fullRows;
  result.passes =
      idealFullInputs > 0 ? fullInputLoads / (idealFullInputs * rows) : 0;
  result.instructionsPerIdealByte = instructions / (ideal * fullRows);
  result.fraction =
      (essential * fullRows / h200::kPeakBytesPerSecond) / seconds;
  return result;
}

//===----------------------------------------------------------------------===//

static llvm::json::Value toJSON(const Result &r) {
  llvm::json::Object buffers;
  for (auto &[name, value] : r.perBufferBytesPerRow)
    buffers[name] = value;
  return llvm::json::Object{
      {"kernel", r.kernel},
      {"dtype", r.dtype},
      {"n", r.n},
      {"model_rows", r.modelRows},
      {"emulated_rows", r.emulatedRows},
      {"threads_per_block", r.threadsPerBlock},
      {"rows_per_block", r.threadsPerBlock / r.tile.threadsPerRow},
      {"row_on_chip", r.tile.rowOnChip},
      {"grid", r.grid},
      {"registers", r.registers},
      {"unasked_registers", r.unaskedRegisters},
      {"finalize_registers", r.finalizeRegisters},
      {"spill_bytes", r.spills},
      {"blocks_per_sm", r.blocksPerSM},
      {"in_flight_bytes_per_sm", r.inFlightPerSM},
      {"bytes_per_row", r.bytesPerRow},
      {"ideal_bytes_per_row", r.idealPerRow},
      {"bytes_per_row_by_buffer", std::move(buffers)},
      {"hbm_bytes_per_row", r.hbmBytesPerRow},
      {"passes", r.passes},
      {"instructions_per_ideal_byte", r.instructionsPerIdealByte},
      {"hbm_fraction", r.fraction},
      {"limit", r.limit},
      {"emulated_thread_instructions", int64_t(r.emulatedInstructions)},
      {"emulated_seconds", r.emulatedSeconds},
  };
}

int main(int argc, char **argv) {
  cl::ParseCommandLineOptions(argc, argv, "tilefuse traffic benchmark\n");
  std::vector<std::string> names;
  for (llvm::StringRef name : kernels::builtinNames()) {
    if (!kernelNames.empty() && !llvm::is_contained(kernelNames, name.str()))
      continue;
    names.push_back(name.str());
    if (derived && name.ends_with("_bwd"))
      names.push_back((name + kDerivedSuffix).str());
  }
  std::vector<std::string> dtypes(dtypeNames.begin(), dtypeNames.end());
  if (dtypes.empty())
    dtypes = {"bf16", "f32"};
  std::vector<int64_t> ns(lengths.begin(), lengths.end());
  if (ns.empty())
    ns = {1000, 4096, 8192, 32000, 128256, 262144};
  emu::setTrafficDetail(true);
  Runtime runtime{std::nullopt};

  llvm::outs() << llvm::formatv(
      "H200 model: {0} TB/s HBM, {1} SMs, {2} registers and {3} threads per "
      "SM, {4} MB L2, {5} GHz, {6:f2} us memory latency ({10:f1} us a round "
      "trip a barrier ends); {7} rows per launch. Budget: {8:f1} "
      "thread-instructions per byte, {9:f0} KiB in flight per SM at full "
      "bandwidth.\n\n",
      h200::kPeakBytesPerSecond / 1e12, h200::kSMs, h200::kRegistersPerSM,
      h200::kThreadsPerSM, 50, h200::kClock / 1e9, h200::kLatency * 1e6,
      modelRows.getValue(),
      h200::kIssueLanes * h200::kSMs * h200::kClock / h200::kPeakBytesPerSecond,
      h200::kInFlightPerSM / 1024, h200::kSynchronizedRoundTrip * 1e6);
  llvm::outs()
      << "| kernel | dtype | n | bytes/row | ideal/row | ratio | "
         "passes | instr/ideal B | regs | blocks/SM | KiB in flight/SM "
         "| est. HBM | limit |\n"
         "|---|---|---|---|---|---|---|---|---|---|---|---|---|\n";
  llvm::json::Array json;
  std::vector<Result> results;
  uint64_t instructions = 0;
  double seconds = 0;
  int failures = 0;
  for (const std::string &name : names)
    for (const std::string &dtype : dtypes)
      for (int64_t n : ns) {
        llvm::Expected<Result> result = measure(runtime, name, dtype, n);
        if (!result) {
          llvm::errs() << name << " " << dtype << " n=" << n << ": "
                       << llvm::toString(result.takeError()) << "\n";
          ++failures;
          continue;
        }
        const Result &r = *result;
        llvm::outs() << llvm::formatv(
            "| {0} | {1} | {2} | {3:f0} | {4:f0} | {5:f2} | {6:f2} | {7:f2} | "
            "{8}{9} | {10} | {11:f0} | {12:f0}% | {13} |\n",
            r.kernel, r.dtype, r.n, r.bytesPerRow, r.idealPerRow,
            r.bytesPerRow / r.idealPerRow, r.passes, r.instructionsPerIdealByte,
            r.unaskedRegisters ? llvm::formatv("{0} (asked; {1})", r.registers,
                                               r.unaskedRegisters)
                                     .str()
                               : std::to_string(r.registers),
            r.finalizeRegisters
                ? llvm::formatv("+{0}", r.finalizeRegisters).str()
                : "",
            r.blocksPerSM, r.inFlightPerSM / 1024, 100 * r.fraction, r.limit);
        llvm::outs().flush();
        instructions += r.emulatedInstructions;
        seconds += r.emulatedSeconds;
        json.push_back(toJSON(r));
        results.push_back(r);
      }
  // The same, one line per kernel and dtype: estimated fraction of HBM
  // bandwidth (bytes per row against the ideal) at each n.
  llvm::outs() << "\n| kernel | dtype |";
  for (int64_t n : ns)
    llvm::outs() << " n = " << n << " |";
  llvm::outs() << "\n|---|---|";
  for (size_t i = 0; i < ns.size(); ++i)
    llvm::outs() << "---|";
  llvm::outs() << "\n";
  for (const std::string &name : names)
    for (const std::string &dtype : dtypes) {
      llvm::outs() << "| " << name << " | " << dtype << " |";
      for (int64_t n : ns) {
        auto r = llvm::find_if(results, [&](const Result &r) {
          return r.kernel == name && r.dtype == dtype && r.n == n;
        });
        if (r == results.end())
          llvm::outs() << " failed |";
        else
          llvm::outs() << llvm::formatv(" {0:f0}% ({1:f2}x) |",
                                        100 * r->fraction,
                                        r->bytesPerRow / r->idealPerRow);
      }
      llvm::outs() << "\n";
    }
  llvm::outs() << llvm::formatv(
      "\nThe emulator ran {0:e2} thread-instructions in {1:f1} s ({2:e2} per "
      "second, traffic detail on).\n",
      double(instructions), seconds, instructions / std::max(seconds, 1e-9));
  if (!jsonPath.empty()) {
    std::error_code error;
    llvm::raw_fd_ostream file(jsonPath, error);
    if (error) {
      llvm::errs() << "cannot write " << jsonPath << ": " << error.message()
                   << "\n";
      return 1;
    }
    file << llvm::formatv("{0:2}", llvm::json::Value(std::move(json))) << "\n";
  }
  return failures ? 1 : 0;
}
