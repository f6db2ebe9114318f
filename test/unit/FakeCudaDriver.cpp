//===- FakeCudaDriver.cpp - a libcuda stand-in that records launches ------===//
//
// Exports the driver calls CudaDriver resolves, so its loading, per-context
// modules, KernelABI parameter packing and error reporting are tested on a
// machine with no GPU. The test reads what was launched through
// fakeCudaState().
//
//===----------------------------------------------------------------------===//

#include "FakeCudaDriver.h"

#include <cstdlib>
#include <cstring>

namespace {
FakeCudaState state;
const char *const kErrorNames[] = {"CUDA_SUCCESS", "CUDA_ERROR_INVALID_VALUE"};
} // namespace

FakeCudaState &fakeCudaState() { return state; }

extern "C" {
int cuInit(unsigned) { return 0; }
int cuGetErrorName(int result, const char **name) {
  *name = result == 1 ? kErrorNames[1] : nullptr;
  return 0;
}
int cuGetErrorString(int result, const char **text) {
  *text = result == 1 ? "invalid argument" : nullptr;
  return 0;
}
int cuCtxGetCurrent(void **context) {
  *context = state.context;
  return 0;
}
int cuCtxSetCurrent(void *context) {
  state.context = context;
  return 0;
}
int cuDevicePrimaryCtxRetain(void **context, int) {
  ++state.primaryRetains;
  *context = state.primaryContext;
  return 0;
}
int cuDeviceGetAttribute(int *value, int attribute, int) {
  switch (attribute) {
  case 16: *value = state.multiprocessors; return 0;
  case 75: *value = state.major; return 0;
  case 76: *value = state.minor; return 0;
  default: return 1;
  }
}
int cuModuleLoadData(void **module, const void *image) {
  ++state.modulesLoaded;
  state.lastImage = static_cast<const char *>(image);
  state.images.push_back(state.lastImage);
  // The module handle is its index in `images` + 1.
  *module = reinterpret_cast<void *>(state.images.size());
  return 0;
}
/// As the real driver: options name the JIT's log buffers.
int cuModuleLoadDataEx(void **module, const void *image, unsigned count,
                       int *options, void **values) {
  ++state.loadAttempts;
  for (unsigned i = 0; i < count; ++i)
    if (options[i] == 5 &&
        !state.jitErrorLog.empty()) // CU_JIT_ERROR_LOG_BUFFER
      std::strcpy(static_cast<char *>(values[i]), state.jitErrorLog.c_str());
  if (state.loadResult)
    return state.loadResult;
  if (state.loadResultWhenAsked &&
      std::strstr(static_cast<const char *>(image), ".minnctapersm"))
    return state.loadResultWhenAsked;
  return cuModuleLoadData(module, image);
}
int cuModuleGetFunction(void **function, void *module, const char *name) {
  state.functions.emplace_back(name);
  const std::string &image = state.images[reinterpret_cast<size_t>(module) - 1];
  size_t asks = image.find(".minnctapersm ");
  state.asked.push_back(
      asks == std::string::npos
          ? 0
          : std::atoi(image.c_str() + asks + sizeof(".minnctapersm")));
  // The block size in the entry's own header (between its name and body).
  size_t entry = image.find(".entry " + std::string(name) + "(");
  size_t body = image.find("\n{", entry);
  size_t bound = image.find(".maxntid ", entry);
  state.bounded.push_back(
      entry == std::string::npos || bound > body
          ? 0
          : std::atoi(image.c_str() + bound + sizeof(".maxntid")));
  // The function handle is its index + 1.
  *function = reinterpret_cast<void *>(state.functions.size());
  return 0;
}
int cuModuleUnload(void *module) {
  ++state.modulesUnloaded;
  state.unloadedModules.push_back(reinterpret_cast<size_t>(module));
  return 0;
}
int cuFuncGetAttribute(int *value, int attribute, void *function) {
  if (attribute != 3) // CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES
    return 1;
  size_t index = reinterpret_cast<size_t>(function) - 1;
  int asked = state.asked[index];
  *value = asked ? state.localBytesWhenAsked[asked]
                 : state.localBytesWhenBounded[state.bounded[index]];
  return 0;
}
int cuFuncSetAttribute(void *function, int attribute, int value) {
  state.sharedOptIns.push_back(
      {state.functions[reinterpret_cast<size_t>(function) - 1], attribute,
       value});
  return 0;
}
int cuOccupancyMaxActiveBlocksPerMultiprocessor(int *blocks, void *function,
                                                int blockSize,
                                                size_t dynamicSharedBytes) {
  state.occupancyQueries.push_back(
      {state.functions[reinterpret_cast<size_t>(function) - 1], blockSize,
       dynamicSharedBytes});
  size_t index = reinterpret_cast<size_t>(function) - 1;
  int asked = state.asked[index];
  auto bounded = state.residentBlocksWhenBounded.find(state.bounded[index]);
  *blocks =
      asked ? (state.residentBlocksWhenAsked ? state.residentBlocksWhenAsked
                                             : asked)
      : bounded != state.residentBlocksWhenBounded.end() ? bounded->second
                                                         : state.residentBlocks;
  return 0;
}
int cuLaunchKernel(void *function, unsigned gridX, unsigned, unsigned,
                   unsigned blockX, unsigned, unsigned, unsigned sharedBytes,
                   void *stream, void **params, void **) {
  FakeCudaState::Launch launch;
  launch.handle = reinterpret_cast<size_t>(function);
  launch.function = state.functions[launch.handle - 1];
  launch.grid = gridX;
  launch.block = blockX;
  launch.dynamicSharedBytes = sharedBytes;
  launch.stream = stream;
  for (int i = 0; i < state.paramsPerLaunch[state.launches.size()]; ++i) {
    uint64_t value = 0;
    std::memcpy(&value, params[i], sizeof(value));
    launch.params.push_back(value);
  }
  state.launches.push_back(launch);
  return state.launchResult;
}
}
