//===- Driver.cpp - the CUDA driver entry points, emulated ----------------===//
//
// What CudaDriver resolves from libcuda.so.1, with the driver's signatures
// and result codes: one device (the emulated chip), a primary context per
// process, modules parsed from PTX, and launches that run to completion
// before cuLaunchKernel returns. A failure's message (a parse error, a
// failed check) is what cuGetErrorString returns for that result on the
// calling thread.
//
//===----------------------------------------------------------------------===//

#include "Interpreter.h"

#include "llvm/ADT/StringSwitch.h"
#include "llvm/Support/FormatVariadic.h"
#include "llvm/Support/raw_ostream.h"

#include <cstdlib>
#include <deque>
#include <map>
#include <mutex>
#include <optional>
#include <thread>
#include <utility>

using namespace tilefuse::emulator;

namespace {

struct Device {
  std::string chip = "sm_90";
  unsigned sm = 90;
  int multiprocessors = 132;
  bool configured = false; // by setDevice: TILEFUSE_TARGET is not read
};

struct LoadedModule;
/// The default limit on a launch's dynamic shared memory; past it a
/// function opts in with cuFuncSetAttribute, up to its chip's sharedOptIn.
constexpr uint32_t kDefaultSharedPerBlock = 49152;

struct LoadedFunction {
  LoadedModule *module;
  const Function *function;
  uint32_t maxDynamicSharedBytes;
};
struct LoadedModule {
  std::unique_ptr<Module> module;
  std::deque<LoadedFunction> functions;
};

struct State {
  std::mutex mutex;
  Device device;
  bool initialized = false;
  std::deque<LaunchRecord> records;
  unsigned hostThreads = 0;
  bool trafficDetail = false;
  std::optional<Approximation> approximation; // by setApproximation
  uint64_t blockInstructionBudget = 0;
  bool log = false;
  /// Per function name (setRegisters): plain, per .minnctapersm, and per
  /// .maxntid given to PTX that had none.
  struct Allocations {
    PtxasAllocation plain;
    std::map<unsigned, PtxasAllocation> whenAsked, whenBounded;
  };
  std::map<std::string, Allocations> registers;
};

State &state() {
  static State *instance = new State; // never destroyed: see CudaDriver
  return *instance;
}

/// The primary context: the only one.
int primaryContext;
thread_local void *currentContext = nullptr;
thread_local std::vector<Buffer> nextBuffers;
thread_local int lastResult = kSuccess;
thread_local std::string lastMessage;

/// takeFailedCalls: this thread's failed calls since it last asked.
thread_local std::vector<std::string> failedCalls;
constexpr size_t kKeptFailedCalls = 64;

int failWith(int result, std::string message) {
  lastResult = result;
  lastMessage = "emulator: " + std::move(message);
  if (failedCalls.size() < kKeptFailedCalls)
    failedCalls.push_back(lastMessage);
  return result;
}

struct Chip {
  const char *name;
  unsigned sm;
  int multiprocessors, clockKHz, l2Bytes, sharedPerSM, sharedOptIn;
};
/// H200-like (sm_90) and A100-like (sm_80) devices.
constexpr Chip kChips[] = {
    {"sm_90", 90, 132, 1980000, 50 * 1024 * 1024, 233472, 232448},
    {"sm_80", 80, 108, 1410000, 40 * 1024 * 1024, 167936, 166912},
};

const Chip *chipNamed(llvm::StringRef name) {
  for (const Chip &chip : kChips)
    if (name == chip.name)
      return &chip;
  return nullptr;
}

/// Host threads from TILEFUSE_EMULATE_THREADS (unset or empty: the
/// hardware's concurrency); 0 after failWith for a value that is not an
/// integer from 1 to kMaxHostThreads.
unsigned defaultHostThreads() {
  constexpr unsigned kMaxHostThreads = 1024;
  llvm::StringRef text = llvm::StringRef(std::getenv("TILEFUSE_EMULATE_THREADS"))
                             .trim();
  if (text.empty())
    return std::max(1u, std::thread::hardware_concurrency());
  unsigned threads = 0;
  if (text.getAsInteger(10, threads) || threads == 0 ||
      threads > kMaxHostThreads) {
    failWith(kInvalidValue,
             llvm::formatv("TILEFUSE_EMULATE_THREADS={0}: expected the number "
                           "of host threads that run blocks, an integer from "
                           "1 to {1}",
                           text, kMaxHostThreads));
    return 0;
  }
  return threads;
}

} // namespace

//===----------------------------------------------------------------------===//
// The C++ interface (Emulator.h)
//===----------------------------------------------------------------------===//

const char *tilefuse::emulator::className(InstructionClass kind) {
  switch (kind) {
  case InstructionClass::Memory: return "memory";
  case InstructionClass::Arithmetic: return "arithmetic";
  case InstructionClass::Double: return "f64";
  case InstructionClass::Transcendental: return "transcendental";
  case InstructionClass::Division: return "division";
  case InstructionClass::Conversion: return "conversion";
  case InstructionClass::Sync: return "sync";
  case InstructionClass::Control: return "control";
  case InstructionClass::Count: break;
  }
  return "?";
}

uint64_t LaunchRecord::totalInstructions() const {
  uint64_t total = 0;
  for (uint64_t count : instructions)
    total += count;
  return total;
}

uint64_t LaunchRecord::loadedBytes() const {
  uint64_t total = 0;
  for (const BufferTraffic &buffer : buffers)
    total += buffer.loadedBytes;
  return total;
}

uint64_t LaunchRecord::storedBytes() const {
  uint64_t total = 0;
  for (const BufferTraffic &buffer : buffers)
    total += buffer.storedBytes;
  return total;
}

std::string LaunchRecord::summary() const {
  std::string text;
  llvm::raw_string_ostream os(text);
  os << llvm::formatv("tilefuse emulate: {0} on {1}, grid {2}x{3}x{4}, block "
                      "{5}x{6}x{7}:",
                      kernel, chip, grid[0], grid[1], grid[2], block[0],
                      block[1], block[2]);
  for (const BufferTraffic &buffer : buffers)
    os << llvm::formatv(" {0} ld {1} B st {2} B;", buffer.name,
                        buffer.loadedBytes, buffer.storedBytes);
  os << llvm::formatv(" {0} thread-instructions (", totalInstructions());
  bool first = true;
  for (size_t c = 0; c < kInstructionClasses; ++c) {
    if (!instructions[c])
      continue;
    os << (first ? "" : ", ") << className(static_cast<InstructionClass>(c))
       << " " << instructions[c];
    first = false;
  }
  os << llvm::formatv("), {0} barriers, {1} shuffles, {2:f3} s", barriers,
                      shuffles, seconds);
  return text;
}

std::vector<LaunchRecord> tilefuse::emulator::takeLaunches() {
  State &s = state();
  std::lock_guard<std::mutex> lock(s.mutex);
  std::vector<LaunchRecord> records(s.records.begin(), s.records.end());
  s.records.clear();
  return records;
}

std::vector<std::string> tilefuse::emulator::takeFailedCalls() {
  return std::exchange(failedCalls, {});
}

bool tilefuse::emulator::setDevice(const std::string &chip,
                                   int multiprocessors) {
  const Chip *known = chipNamed(chip);
  if (!known)
    return false;
  State &s = state();
  std::lock_guard<std::mutex> lock(s.mutex);
  s.device.chip = known->name;
  s.device.sm = known->sm;
  s.device.multiprocessors =
      multiprocessors > 0 ? multiprocessors : known->multiprocessors;
  s.device.configured = true;
  return true;
}

std::string tilefuse::emulator::deviceChip() {
  State &s = state();
  std::lock_guard<std::mutex> lock(s.mutex);
  return s.device.chip;
}

int tilefuse::emulator::deviceMultiprocessors() {
  State &s = state();
  std::lock_guard<std::mutex> lock(s.mutex);
  return s.device.multiprocessors;
}

int tilefuse::emulator::residentBlocks(int64_t threads, int registers,
                                       int64_t sharedBytes) {
  constexpr int64_t kThreadsPerSM = 2048, kBlocksPerSM = 32,
                    kRegistersPerSM = 65536, kReservedSharedPerBlock = 1024;
  int64_t sharedPerSM = chipNamed(deviceChip())->sharedPerSM;
  // As cuda_occupancy.h counts them: each of the SM's 4 quarters gives its
  // 16K registers out to warps in units of 256, and a block must fit its
  // 64K as if its warps were rounded up to a multiple of 4.
  constexpr int64_t kQuarters = 4;
  int64_t warps = (threads + 31) / 32;
  int64_t perWarp = llvm::alignTo(int64_t(registers) * 32, 256);
  int64_t byRegisters =
      perWarp == 0 ? kBlocksPerSM
      : perWarp * llvm::alignTo(warps, kQuarters) > kRegistersPerSM
          ? 0
          : kRegistersPerSM / kQuarters / perWarp * kQuarters / warps;
  return int(std::min<int64_t>(
      {kBlocksPerSM, byRegisters, kThreadsPerSM / threads,
       sharedPerSM / (sharedBytes + kReservedSharedPerBlock)}));
}

void tilefuse::emulator::setRegisters(
    const std::string &function, PtxasAllocation plain,
    const std::map<unsigned, PtxasAllocation> &whenAsked,
    const std::map<unsigned, PtxasAllocation> &whenBounded) {
  State &s = state();
  std::lock_guard<std::mutex> lock(s.mutex);
  s.registers[function] = {plain, whenAsked, whenBounded};
}

void tilefuse::emulator::setApproximation(Approximation mode) {
  State &s = state();
  std::lock_guard<std::mutex> lock(s.mutex);
  s.approximation = mode;
}

std::optional<Approximation>
tilefuse::emulator::parseApproximation(std::string_view name) {
  return llvm::StringSwitch<std::optional<Approximation>>(name)
      .Case("exact", Approximation::Exact)
      .Case("high", Approximation::High)
      .Case("low", Approximation::Low)
      .Default(std::nullopt);
}

void tilefuse::emulator::setTrafficDetail(bool on) {
  State &s = state();
  std::lock_guard<std::mutex> lock(s.mutex);
  s.trafficDetail = on;
}

void tilefuse::emulator::setBlockInstructionBudget(uint64_t budget) {
  State &s = state();
  std::lock_guard<std::mutex> lock(s.mutex);
  s.blockInstructionBudget = budget;
}

void tilefuse::emulator::setHostThreads(unsigned threads) {
  State &s = state();
  std::lock_guard<std::mutex> lock(s.mutex);
  s.hostThreads = threads;
}

//===----------------------------------------------------------------------===//
// The driver API
//===----------------------------------------------------------------------===//

/// What ptxas gives `function` (setRegisters).
static PtxasAllocation allocationOf(const Function &function) {
  State &s = state();
  PtxasAllocation plain;
  unsigned blocks = function.minBlocksPerSM;
  {
    std::lock_guard<std::mutex> lock(s.mutex);
    auto known = s.registers.find(function.name);
    if (known == s.registers.end())
      return {};
    const auto &[given, whenAsked, whenBounded] = known->second;
    if (blocks) {
      auto asked = whenAsked.find(blocks);
      if (asked != whenAsked.end())
        return asked->second;
    } else if (function.maxThreads) {
      // A block size (one the plain PTX did not have, where the benchmark
      // said what ptxas gives it): at least one such block fits, as ptxas
      // makes it.
      auto bounded = whenBounded.find(function.maxThreads);
      if (bounded != whenBounded.end())
        return bounded->second;
      blocks = 1;
    }
    if (!blocks)
      return given;
    plain = given;
  }
  uint32_t threads = function.maxThreads ? function.maxThreads
                                         : function.requiredThreads[0] *
                                               function.requiredThreads[1] *
                                               function.requiredThreads[2];
  if (threads == 0)
    return {plain.registers, 0};
  // The most registers (255, then units of 8) that leave room for that many
  // blocks, at least 8 (0 would read as unknown).
  int cap = 255;
  while (cap > 8 &&
         tilefuse::emulator::residentBlocks(threads, cap, 0) < int(blocks))
    cap = (cap - 1) / 8 * 8;
  if (plain.registers <= cap)
    return plain;
  return {cap, 0};
}

extern "C" {

int tilefuseEmulatorSetBuffers(const TilefuseEmulatorBuffer *buffers,
                               size_t count) {
  nextBuffers.clear();
  for (size_t i = 0; i < count; ++i)
    nextBuffers.push_back({buffers[i].name ? buffers[i].name : "",
                           reinterpret_cast<uint64_t>(buffers[i].base),
                           buffers[i].bytes});
  return kSuccess;
}

int cuInit(unsigned flags) {
  if (flags != 0)
    return failWith(kInvalidValue, "cuInit takes flags 0");
  State &s = state();
  std::lock_guard<std::mutex> lock(s.mutex);
  if (s.initialized)
    return kSuccess;
  const char *log = std::getenv("TILEFUSE_LOG");
  s.log = log && llvm::StringRef(log).contains("emulate");
  if (!s.hostThreads && !(s.hostThreads = defaultHostThreads()))
    return lastResult;
  if (!s.approximation) {
    llvm::StringRef text =
        llvm::StringRef(std::getenv("TILEFUSE_EMULATE_APPROX")).trim();
    // Unset or empty: exact.
    std::optional<Approximation> mode =
        text.empty() ? Approximation::Exact : parseApproximation(text);
    if (!mode)
      return failWith(kInvalidValue,
                      llvm::formatv("TILEFUSE_EMULATE_APPROX={0}: expected "
                                    "exact, high or low",
                                    text));
    s.approximation = mode;
  }
  // TILEFUSE_TARGET=emulate or emulate:sm_XX picks the chip.
  if (!s.device.configured)
    if (const char *target = std::getenv("TILEFUSE_TARGET")) {
      llvm::StringRef text(target);
      if (text.consume_front("emulate:")) {
        const Chip *chip = chipNamed(text);
        if (!chip)
          return failWith(kInvalidValue,
                          llvm::formatv("TILEFUSE_TARGET=emulate:{0}: the "
                                        "emulator has sm_80 and sm_90",
                                        text));
        s.device.chip = chip->name;
        s.device.sm = chip->sm;
        s.device.multiprocessors = chip->multiprocessors;
      }
    }
  s.initialized = true;
  return kSuccess;
}

int cuGetErrorName(int result, const char **name) {
  switch (result) {
  case kSuccess: *name = "CUDA_SUCCESS"; break;
  case kInvalidValue: *name = "CUDA_ERROR_INVALID_VALUE"; break;
  case kNotInitialized: *name = "CUDA_ERROR_NOT_INITIALIZED"; break;
  case kNoBinaryForGpu: *name = "CUDA_ERROR_NO_BINARY_FOR_GPU"; break;
  case kInvalidPtx: *name = "CUDA_ERROR_INVALID_PTX"; break;
  case kInvalidHandle: *name = "CUDA_ERROR_INVALID_HANDLE"; break;
  case kNotFound: *name = "CUDA_ERROR_NOT_FOUND"; break;
  case kIllegalAddress: *name = "CUDA_ERROR_ILLEGAL_ADDRESS"; break;
  case kLaunchOutOfResources:
    *name = "CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES";
    break;
  case kMisalignedAddress: *name = "CUDA_ERROR_MISALIGNED_ADDRESS"; break;
  case kLaunchFailed: *name = "CUDA_ERROR_LAUNCH_FAILED"; break;
  default:
    *name = nullptr;
    return kInvalidValue;
  }
  return kSuccess;
}

int cuGetErrorString(int result, const char **text) {
  if (result == lastResult && result != kSuccess) {
    *text = lastMessage.c_str();
    return kSuccess;
  }
  const char *name = nullptr;
  int known = cuGetErrorName(result, &name);
  *text = name;
  return known;
}

int cuCtxGetCurrent(void **context) {
  *context = currentContext;
  return kSuccess;
}

int cuCtxSetCurrent(void *context) {
  if (context && context != &primaryContext)
    return failWith(kInvalidValue, "unknown context");
  currentContext = context;
  return kSuccess;
}

int cuDevicePrimaryCtxRetain(void **context, int device) {
  if (device != 0)
    return failWith(kInvalidValue,
                    llvm::formatv("device {0} does not exist (the emulator "
                                  "has device 0)",
                                  device));
  *context = &primaryContext;
  return kSuccess;
}

int cuDeviceGetAttribute(int *value, int attribute, int device) {
  State &s = state();
  std::lock_guard<std::mutex> lock(s.mutex);
  if (!s.initialized)
    return failWith(kNotInitialized, "cuInit was not called");
  if (device != 0)
    return failWith(kInvalidValue, llvm::formatv("device {0} does not exist",
                                                 device));
  const Chip &chip = *chipNamed(s.device.chip);
  switch (attribute) {
  case 1: *value = 1024; break;                      // threads per block
  case 2: case 3: *value = 1024; break;              // block x, y
  case 4: *value = 64; break;                        // block z
  case 5: *value = 2147483647; break;                // grid x
  case 6: case 7: *value = 65535; break;             // grid y, z
  case 8: *value = 49152; break;                     // shared per block
  case 10: *value = 32; break;                       // warp size
  case 12: *value = 65536; break;                    // registers per block
  case 13: *value = chip.clockKHz; break;
  case 16: *value = s.device.multiprocessors; break;
  case 38: *value = chip.l2Bytes; break;
  case 39: *value = 2048; break;                     // threads per SM
  case 75: *value = chip.sm / 10; break;             // compute capability
  case 76: *value = chip.sm % 10; break;
  case 81: *value = chip.sharedPerSM; break;
  case 82: *value = 65536; break;                    // registers per SM
  case 97: *value = chip.sharedOptIn; break;
  case 106: *value = 32; break;                      // blocks per SM
  default:
    return failWith(kInvalidValue,
                    llvm::formatv("device attribute {0} is not emulated",
                                  attribute));
  }
  return kSuccess;
}

int cuModuleLoadData(void **module, const void *image) {
  State &s = state();
  unsigned sm;
  std::string chip;
  {
    std::lock_guard<std::mutex> lock(s.mutex);
    if (!s.initialized)
      return failWith(kNotInitialized, "cuInit was not called");
    sm = s.device.sm;
    chip = s.device.chip;
  }
  if (!currentContext)
    return failWith(kInvalidValue, "no current context");
  llvm::Expected<std::unique_ptr<Module>> parsed =
      parseModule(static_cast<const char *>(image));
  if (!parsed)
    return failWith(kInvalidPtx, llvm::toString(parsed.takeError()));
  if ((*parsed)->smVersion > sm)
    return failWith(kNoBinaryForGpu,
                    llvm::formatv("the PTX targets {0}, the emulated device "
                                  "is {1}",
                                  (*parsed)->target, chip));
  auto *loaded = new LoadedModule;
  loaded->module = std::move(*parsed);
  *module = loaded;
  return kSuccess;
}

int cuModuleGetFunction(void **function, void *module, const char *name) {
  if (!module)
    return failWith(kInvalidHandle, "null module");
  auto *loaded = static_cast<LoadedModule *>(module);
  const Function *found = loaded->module->find(name);
  if (!found || !found->entry || !found->hasBody)
    return failWith(kNotFound, llvm::formatv("the module has no kernel {0}",
                                             name));
  uint32_t staticBytes = found->staticSharedBytes;
  loaded->functions.push_back(
      {loaded, found,
       staticBytes < kDefaultSharedPerBlock
           ? kDefaultSharedPerBlock - staticBytes
           : 0});
  *function = &loaded->functions.back();
  return kSuccess;
}

/// The registers and local memory of setRegisters (CU_FUNC_ATTRIBUTE_NUM_REGS
/// and _LOCAL_SIZE_BYTES); nothing else.
int cuFuncGetAttribute(int *value, int attribute, void *function) {
  if (!function || !value)
    return failWith(kInvalidHandle, "null function or result");
  auto &loaded = *static_cast<LoadedFunction *>(function);
  constexpr int kLocalSizeBytes = 3, kNumRegisters = 4;
  PtxasAllocation given = allocationOf(*loaded.function);
  if (attribute == kLocalSizeBytes)
    *value = given.localBytes;
  else if (attribute == kNumRegisters)
    *value = given.registers;
  else
    return failWith(
        kInvalidValue,
        llvm::formatv("function attribute {0} is not emulated", attribute));
  return kSuccess;
}

int cuFuncSetAttribute(void *function, int attribute, int value) {
  if (!function)
    return failWith(kInvalidHandle, "null function");
  auto &loaded = *static_cast<LoadedFunction *>(function);
  if (attribute != 8) // CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
    return failWith(kInvalidValue,
                    llvm::formatv("function attribute {0} is not emulated",
                                  attribute));
  State &s = state();
  int64_t optIn;
  {
    std::lock_guard<std::mutex> lock(s.mutex);
    optIn = chipNamed(s.device.chip)->sharedOptIn;
  }
  int64_t allowed = optIn - loaded.function->staticSharedBytes;
  if (value < 0 || value > allowed)
    return failWith(kInvalidValue,
                    llvm::formatv("{0}: {1} bytes of dynamic shared memory; "
                                  "the device allows {2} beside its {3} static "
                                  "bytes",
                                  loaded.function->name, value, allowed,
                                  loaded.function->staticSharedBytes));
  loaded.maxDynamicSharedBytes = value;
  return kSuccess;
}

/// residentBlocks, with the registers setRegisters gave the function (none:
/// registers limit nothing).
int cuOccupancyMaxActiveBlocksPerMultiprocessor(int *blocks, void *function,
                                                int blockSize,
                                                size_t dynamicSharedBytes) {
  if (!function || !blocks)
    return failWith(kInvalidHandle, "null function or result");
  auto &loaded = *static_cast<LoadedFunction *>(function);
  if (blockSize < 1 || blockSize > 1024)
    return failWith(kInvalidValue,
                    llvm::formatv("{0}: block size {1} is not in [1, 1024]",
                                  loaded.function->name, blockSize));
  int registers = allocationOf(*loaded.function).registers;
  *blocks = residentBlocks(
      blockSize, registers,
      loaded.function->staticSharedBytes + int64_t(dynamicSharedBytes));
  return kSuccess;
}

int cuModuleUnload(void *module) {
  delete static_cast<LoadedModule *>(module);
  return kSuccess;
}

int cuLaunchKernel(void *function, unsigned gridX, unsigned gridY,
                   unsigned gridZ, unsigned blockX, unsigned blockY,
                   unsigned blockZ, unsigned sharedBytes, void *stream,
                   void **params, void **extra) {
  (void)stream; // launches complete before returning: any stream is fine
  std::vector<Buffer> buffers = std::move(nextBuffers);
  nextBuffers.clear();
  if (!function)
    return failWith(kInvalidHandle, "null function");
  const LoadedFunction &loaded = *static_cast<LoadedFunction *>(function);
  const Function &kernel = *loaded.function;
  if (extra)
    return failWith(kInvalidValue,
                    "the extra launch argument is not supported");
  // The driver's limits (each block dimension first: their product may
  // wrap), and blocks the emulator counts in 32 bits.
  uint64_t threads = uint64_t(blockX) * blockY * blockZ,
           blocks = uint64_t(gridX) * gridY * gridZ;
  if (!blocks || !threads || blockX > 1024 || blockY > 1024 || blockZ > 64 ||
      threads > 1024 || gridX > 2147483647 || gridY > 65535 || gridZ > 65535 ||
      blocks > UINT32_MAX)
    return failWith(kInvalidValue,
                    llvm::formatv("{0}: invalid launch grid {1}x{2}x{3}, "
                                  "block {4}x{5}x{6}",
                                  kernel.name, gridX, gridY, gridZ, blockX,
                                  blockY, blockZ));
  if (kernel.maxThreads && threads > kernel.maxThreads)
    return failWith(kInvalidValue,
                    llvm::formatv("{0}: {1} threads per block exceed its "
                                  ".maxntid {2}",
                                  kernel.name, threads, kernel.maxThreads));
  if (kernel.requiredThreads[0] &&
      (kernel.requiredThreads[0] != blockX ||
       kernel.requiredThreads[1] != blockY ||
       kernel.requiredThreads[2] != blockZ))
    return failWith(kInvalidValue,
                    llvm::formatv("{0}: block {1}x{2}x{3} differs from its "
                                  ".reqntid",
                                  kernel.name, blockX, blockY, blockZ));
  bool dynamic = llvm::any_of(kernel.shared, [](const SharedArray &array) {
    return array.dynamic;
  });
  if (sharedBytes && !dynamic)
    return failWith(kInvalidValue,
                    llvm::formatv("{0}: {1} bytes of dynamic shared memory for "
                                  "a kernel without an .extern .shared array",
                                  kernel.name, sharedBytes));
  if (kernel.staticSharedBytes > kDefaultSharedPerBlock)
    return failWith(kLaunchOutOfResources,
                    llvm::formatv("{0}: {1} bytes of static shared memory "
                                  "exceed 48 KiB per block",
                                  kernel.name, kernel.staticSharedBytes));
  if (sharedBytes > loaded.maxDynamicSharedBytes)
    return failWith(kInvalidValue,
                    llvm::formatv("{0}: {1} bytes of dynamic shared memory "
                                  "exceed the function's {2} (past 48 KiB "
                                  "per block, cuFuncSetAttribute opts in)",
                                  kernel.name, sharedBytes,
                                  loaded.maxDynamicSharedBytes));
  // As the driver does: a block needs its registers (where setRegisters
  // said what ptxas gives) and shared memory on one SM.
  int registers = allocationOf(kernel).registers;
  if (residentBlocks(threads, registers,
                     kernel.staticSharedBytes + int64_t(sharedBytes)) == 0)
    return failWith(kLaunchOutOfResources,
                    llvm::formatv("{0}: a block of {1} threads with {2} "
                                  "registers a thread and {3} bytes of shared "
                                  "memory does not fit on an SM",
                                  kernel.name, threads, registers,
                                  kernel.staticSharedBytes + sharedBytes));
  if (!params && !kernel.params.empty())
    return failWith(kInvalidValue, llvm::formatv("{0}: no kernel parameters",
                                                 kernel.name));

  Launch launch;
  launch.module = loaded.module->module.get();
  launch.kernel = &kernel;
  launch.grid[0] = gridX;
  launch.grid[1] = gridY;
  launch.grid[2] = gridZ;
  launch.block[0] = blockX;
  launch.block[1] = blockY;
  launch.block[2] = blockZ;
  launch.dynamicSharedBytes = sharedBytes;
  launch.params.assign(kernel.kernelParamBytes, 0);
  for (size_t i = 0; i < kernel.params.size(); ++i)
    std::memcpy(launch.params.data() + kernel.params[i].offset, params[i],
                kernel.params[i].bytes);
  launch.buffers = std::move(buffers);
  State &s = state();
  bool log;
  {
    std::lock_guard<std::mutex> lock(s.mutex);
    if (!s.initialized)
      return failWith(kNotInitialized, "cuInit was not called");
    launch.chip = s.device.chip;
    launch.hostThreads = s.hostThreads ? s.hostThreads : defaultHostThreads();
    if (!launch.hostThreads)
      return lastResult;
    launch.trafficDetail = s.trafficDetail;
    launch.approximation = s.approximation.value_or(Approximation::Exact);
    if (s.blockInstructionBudget)
      launch.blockInstructionBudget = s.blockInstructionBudget;
    log = s.log;
  }
  LaunchRecord record;
  std::optional<LaunchError> error = execute(launch, record);
  if (log)
    llvm::errs() << record.summary() << (error ? " [failed]" : "") << "\n";
  {
    std::lock_guard<std::mutex> lock(s.mutex);
    s.records.push_back(std::move(record));
    while (s.records.size() > 4096)
      s.records.pop_front();
  }
  if (error)
    return failWith(error->code, error->message);
  return kSuccess;
}

} // extern "C"
