//===- Interpreter.h - run a kernel launch on the host ----------*- C++ -*-===//

#ifndef TILEFUSE_EMULATOR_INTERPRETER_H
#define TILEFUSE_EMULATOR_INTERPRETER_H

#include "Program.h"

#include <optional>

namespace tilefuse::emulator {

/// CUDA driver result codes the emulator returns.
enum CudaResult : int {
  kSuccess = 0,
  kInvalidValue = 1,
  kNotInitialized = 3,
  kNoBinaryForGpu = 209,
  kInvalidPtx = 218,
  kInvalidHandle = 400,
  kNotFound = 500,
  kIllegalAddress = 700,
  kLaunchOutOfResources = 701,
  kMisalignedAddress = 716,
  kLaunchFailed = 719,
};

struct LaunchError {
  int code = kLaunchFailed;
  std::string message;
};

/// A global buffer of a launch, as the launcher described it.
struct Buffer {
  std::string name;
  uint64_t base = 0, bytes = 0;
};

struct Launch {
  const Module *module = nullptr;
  const Function *kernel = nullptr;
  unsigned grid[3] = {1, 1, 1}, block[3] = {1, 1, 1};
  unsigned dynamicSharedBytes = 0;
  /// The kernel's parameters, laid out as Function::params says.
  std::vector<uint8_t> params;
  std::vector<Buffer> buffers;
  std::string chip;
  unsigned hostThreads = 1;
  bool trafficDetail = false;
  Approximation approximation = Approximation::Exact;
  /// Thread-instructions a block may run before it fails as a runaway.
  uint64_t blockInstructionBudget = kDefaultBlockInstructionBudget;
};

/// Runs every block of `launch` and fills `record` (counters are filled
/// even when a check fails). The error, if any, is that of the lowest
/// numbered failing block, whatever the number of host threads.
std::optional<LaunchError> execute(const Launch &launch, LaunchRecord &record);

} // namespace tilefuse::emulator

#endif // TILEFUSE_EMULATOR_INTERPRETER_H
