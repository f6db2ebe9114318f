//===- FakeCudaDriver.h - what the fake libcuda recorded --------*- C++ -*-===//

#ifndef TILEFUSE_TEST_FAKECUDADRIVER_H
#define TILEFUSE_TEST_FAKECUDADRIVER_H

#include <cstdint>
#include <map>
#include <string>
#include <vector>

struct FakeCudaState {
  struct Launch {
    std::string function;
    /// The function handle: 1 + its index in `functions`.
    size_t handle = 0;
    unsigned grid = 0, block = 0, dynamicSharedBytes = 0;
    void *stream = nullptr;
    /// Each parameter's first 8 bytes (pass scalars in 8-byte slots).
    std::vector<uint64_t> params;
  };
  /// The calling thread's current context, and the device's primary one.
  void *context = reinterpret_cast<void *>(0x1);
  void *primaryContext = reinterpret_cast<void *>(0x3);
  int primaryRetains = 0;
  int multiprocessors = 132, major = 9, minor = 0;
  /// cuLaunchKernel's result (1: CUDA_ERROR_INVALID_VALUE).
  int launchResult = 0;
  /// How many parameters the next launches pass (the fake cannot know).
  std::vector<int> paramsPerLaunch;
  int modulesLoaded = 0;
  /// cuModuleLoadDataEx's result and the error log it writes, and its
  /// result for PTX that asks for blocks per SM.
  int loadResult = 0, loadResultWhenAsked = 0;
  std::string jitErrorLog;
  /// A copy of the last PTX loaded (the driver copies it too), and of each
  /// module's, by module handle - 1.
  std::string lastImage;
  std::vector<std::string> images;
  std::vector<std::string> functions;
  std::vector<Launch> launches;
  /// cuFuncSetAttribute's calls: function, attribute, value.
  struct Attribute {
    std::string function;
    int attribute = 0, value = 0;
  };
  std::vector<Attribute> sharedOptIns;
  /// What cuOccupancyMaxActiveBlocksPerMultiprocessor answers, and its
  /// calls: function, block size, dynamic shared bytes. For a function
  /// whose PTX asks for N blocks per SM (`.minnctapersm N`), it answers N
  /// (or residentBlocksWhenAsked where that is set), and cuFuncGetAttribute
  /// a local size of localBytesWhenAsked[N] (0 for the others).
  int residentBlocks = 32;
  int residentBlocksWhenAsked = 0;
  std::map<int, int> localBytesWhenAsked;
  /// Per function of `functions`: the blocks per SM its module's PTX asked
  /// for (0: none).
  std::vector<int> asked;
  /// Per function: the block size its entry declares (`.maxntid`, 0: none),
  /// and per such size the local size cuFuncGetAttribute answers for an
  /// entry that asks for nothing (0 where unset).
  std::vector<int> bounded;
  std::map<int, int> localBytesWhenBounded;
  /// Per such block size, what the occupancy query answers for an entry
  /// that asks for nothing (residentBlocks where unset).
  std::map<int, int> residentBlocksWhenBounded;
  int modulesUnloaded = 0;
  /// The handles cuModuleUnload was given, and cuModuleLoadDataEx's calls
  /// (failed ones too).
  std::vector<size_t> unloadedModules;
  int loadAttempts = 0;
  struct OccupancyQuery {
    std::string function;
    int blockSize = 0;
    size_t dynamicSharedBytes = 0;
  };
  std::vector<OccupancyQuery> occupancyQueries;
};

FakeCudaState &fakeCudaState();

#endif // TILEFUSE_TEST_FAKECUDADRIVER_H
