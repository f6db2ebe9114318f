//===- EmulatorChecksTest.cpp - the emulator's checks and semantics -------===//
//
// Hand-written PTX kernels (test/emulator/*.ptx, each accepted by ptxas)
// run through the emulator's driver entry points: each check the emulator
// promises stops its kernel with an error naming the kernel, the PTX line,
// the block and the thread; a kernel of instructions with tricky semantics
// (directed roundings, packed conversions, NaN rules, clamped shifts,
// shuffles) computes what the PTX ISA defines.
//
//===----------------------------------------------------------------------===//

#include "tilefuse/Emulator/Emulator.h"

#include "llvm/Support/MemoryBuffer.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <tuple>
#if defined(__SSE__)
#include <xmmintrin.h>
#endif

extern "C" {
int cuInit(unsigned);
int cuDevicePrimaryCtxRetain(void **, int);
int cuCtxSetCurrent(void *);
int cuGetErrorName(int, const char **);
int cuGetErrorString(int, const char **);
int cuModuleLoadData(void **, const void *);
int cuModuleGetFunction(void **, void *, const char *);
int cuModuleUnload(void *);
int cuOccupancyMaxActiveBlocksPerMultiprocessor(int *, void *, int, size_t);
int cuFuncGetAttribute(int *, int, void *);
int cuLaunchKernel(void *, unsigned, unsigned, unsigned, unsigned, unsigned,
                   unsigned, unsigned, void *, void **, void **);
}

namespace {

/// Sets the calling thread's flush-to-zero and denormals-are-zero modes
/// while it lives.
class HostFlushesSubnormals {
public:
#if defined(__SSE__)
  HostFlushesSubnormals() : saved(_mm_getcsr()) {
    _mm_setcsr(saved | 0x8040); // FTZ, DAZ
  }
  ~HostFlushesSubnormals() { _mm_setcsr(saved); }

private:
  unsigned saved;
#endif
};

constexpr int kInvalidValue = 1, kIllegalAddress = 700,
              kMisalignedAddress = 716, kLaunchFailed = 719, kInvalidPtx = 218,
              kInvalidHandle = 400, kLaunchOutOfResources = 701;

class EmulatorChecks : public ::testing::Test {
protected:
  void SetUp() override {
    ASSERT_EQ(cuInit(0), 0);
    void *context;
    ASSERT_EQ(cuDevicePrimaryCtxRetain(&context, 0), 0);
    ASSERT_EQ(cuCtxSetCurrent(context), 0);
  }
  void TearDown() override {
    if (module)
      cuModuleUnload(module);
  }

  static std::string message(int result) {
    const char *text = nullptr;
    cuGetErrorString(result, &text);
    return text ? text : "";
  }

  /// Loads test/emulator/`name`.ptx; returns the driver's result.
  int load(const std::string &name) {
    auto file = llvm::MemoryBuffer::getFile(
        std::string(TILEFUSE_EMULATOR_PTX_DIR) + "/" + name + ".ptx");
    EXPECT_TRUE(static_cast<bool>(file)) << name;
    if (!file)
      return -1;
    return cuModuleLoadData(&module, (*file)->getBuffer().str().c_str());
  }

  /// Launches kernel `name` of the loaded module on one block of `threads`
  /// threads; `buffers` are what it may touch.
  int launch(const std::string &name, unsigned threads,
             std::vector<void *> params,
             std::vector<TilefuseEmulatorBuffer> buffers = {}) {
    void *function = nullptr;
    int result = cuModuleGetFunction(&function, module, name.c_str());
    if (result)
      return result;
    tilefuseEmulatorSetBuffers(buffers.data(), buffers.size());
    return cuLaunchKernel(function, 1, 1, 1, threads, 1, 1, 0, nullptr,
                          params.data(), nullptr);
  }

  /// Expects `result` to be `code` with a message containing each of
  /// `parts`.
  static void expectError(int result, int code,
                          std::initializer_list<const char *> parts) {
    EXPECT_EQ(result, code);
    std::string text = message(result);
    for (const char *part : parts)
      EXPECT_NE(text.find(part), std::string::npos)
          << "'" << part << "' is not in: " << text;
  }

  void *module = nullptr;
};

TEST_F(EmulatorChecks, OutOfBoundsStore) {
  ASSERT_EQ(load("oob_store"), 0);
  std::vector<uint32_t> out(24);
  void *pointer = out.data();
  expectError(launch("oob_store", 32, {&pointer},
                     {{"out", out.data(), out.size() * 4}}),
              kIllegalAddress,
              {"out-of-bounds global store of 4 bytes",
               "0 bytes past the end of buffer 'out' (96 bytes",
               "kernel oob_store, block (0, 0, 0), thread (24, 0, 0)",
               "PTX line 18: `st.global.u32 \t[%rd3], %r4;`"});
  // Wide enough, it runs.
  out.resize(32);
  pointer = out.data();
  ASSERT_EQ(launch("oob_store", 32, {&pointer},
                   {{"out", out.data(), out.size() * 4}}),
            0);
  EXPECT_EQ(out[31], 31u);
}

/// A table passed by value in the parameter space and indexed at run time
/// (multi-tensor kernels take theirs so): `mov` of its address, `ld.param`
/// through a register, bounds checked against that parameter.
TEST_F(EmulatorChecks, KernelParameterReadThroughItsAddress) {
  ASSERT_EQ(load("param_table"), 0);
  uint64_t table[8] = {8, 11, 22, 33, 44, 55, 66, 77};
  std::vector<uint64_t> out(16);
  void *pointer = out.data();
  std::vector<TilefuseEmulatorBuffer> buffers = {
      {"out", out.data(), out.size() * 8}};
  ASSERT_EQ(launch("param_table", 16, {table, &pointer}, buffers), 0);
  for (size_t i = 0; i < out.size(); ++i)
    EXPECT_EQ(out[i], table[i % 8]) << i;
  // A table claiming 9 words: thread 8 reads past the 64-byte parameter
  // (into `out`, which follows it in the parameter buffer).
  table[0] = 9;
  expectError(launch("param_table", 16, {table, &pointer}, buffers),
              kIllegalAddress,
              {"ld.param of 8 bytes at offset 64 is outside .param table "
               "(64 bytes)",
               "kernel param_table, block (0, 0, 0), thread (8, 0, 0)"});
}

/// Blocks run on several host threads; the error reported is the lowest
/// failing block's, however many there are.
TEST_F(EmulatorChecks, TheErrorDoesNotDependOnHostThreads) {
  ASSERT_EQ(load("oob_store"), 0);
  void *function = nullptr;
  ASSERT_EQ(cuModuleGetFunction(&function, module, "oob_store"), 0);
  std::vector<uint32_t> out(5 * 32 + 7); // blocks 5 to 15 overrun it
  void *pointer = out.data();
  void *params[] = {&pointer};
  std::string first;
  for (unsigned threads : {1u, 2u, 3u}) {
    tilefuse::emulator::setHostThreads(threads);
    TilefuseEmulatorBuffer buffer{"out", out.data(), out.size() * 4};
    tilefuseEmulatorSetBuffers(&buffer, 1);
    int result = cuLaunchKernel(function, 16, 1, 1, 32, 1, 1, 0, nullptr,
                                params, nullptr);
    EXPECT_EQ(result, kIllegalAddress);
    if (first.empty())
      first = message(result);
    EXPECT_EQ(message(result), first) << threads << " host threads";
  }
  tilefuse::emulator::setHostThreads(0);
  EXPECT_NE(first.find("block (5, 0, 0), thread (7, 0, 0)"), std::string::npos)
      << first;
}

TEST_F(EmulatorChecks, SharedMemoryRace) {
  ASSERT_EQ(load("shared_race"), 0);
  std::vector<uint32_t> out(32);
  void *pointer = out.data();
  uint32_t synchronized = 0;
  expectError(launch("shared_race", 32, {&pointer, &synchronized},
                     {{"out", out.data(), 128}}),
              kLaunchFailed,
              {"shared-memory race on byte 4 of 'slots'",
               "thread (0, 0, 0) read it at PTX line 27 with no barrier "
               "between, and this thread writes it",
               "kernel shared_race, block (0, 0, 0), thread (1, 0, 0), PTX "
               "line 17: `st.shared.u32 \t[%r4], %r1;`"});
  // With the barrier: no race, every thread reads its neighbour's slot.
  synchronized = 1;
  ASSERT_EQ(launch("shared_race", 32, {&pointer, &synchronized},
                   {{"out", out.data(), 128}}),
            0)
      << message(kLaunchFailed);
  for (uint32_t i = 0; i < 32; ++i)
    EXPECT_EQ(out[i], (i + 1) % 32);
}

/// Named barriers with a thread count (bar.sync a, b): each group of
/// threads synchronizes on its own, a barrier orders only what its own
/// threads did, and a count no group matches never completes.
TEST_F(EmulatorChecks, NamedBarriersOrderTheirGroups) {
  ASSERT_EQ(load("named_barriers"), 0);
  std::vector<uint32_t> out(128);
  void *pointer = out.data();
  uint32_t cross = 0, count = 64;
  std::vector<void *> params = {&pointer, &cross, &count};
  tilefuse::emulator::takeLaunches();
  ASSERT_EQ(launch("named_barriers", 128, params, {{"out", out.data(), 512}}),
            0)
      << message(kLaunchFailed);
  auto neighbour = [](uint32_t i) { return i / 64 * 64 + (i % 64 + 1) % 64; };
  for (uint32_t i = 0; i < 128; ++i)
    EXPECT_EQ(out[i], neighbour(i) + neighbour(neighbour(i)) + 1000) << i;
  std::vector<tilefuse::emulator::LaunchRecord> launches =
      tilefuse::emulator::takeLaunches();
  ASSERT_EQ(launches.size(), 1u);
  EXPECT_EQ(launches[0].barriers, 5u) << "two per group, one for the block";
  EXPECT_EQ(launches[0].barrierThreads, 4 * 64 + 128u);
  // A group's barrier does not order the other group's write.
  cross = 1;
  expectError(launch("named_barriers", 128, params, {{"out", out.data(), 512}}),
              kLaunchFailed,
              {"shared-memory race on byte 260 of 'slots': thread (65, 0, 0) "
               "wrote it at PTX line 21 with no barrier between, and this "
               "thread reads it",
               "thread (0, 0, 0), PTX line 33"});
  cross = 0;
  count = 96;
  expectError(launch("named_barriers", 128, params, {{"out", out.data(), 512}}),
              kLaunchFailed,
              {"deadlock: barrier 1 waits for 96 threads and 64 arrived"});
  count = 32;
  expectError(launch("named_barriers", 128, params, {{"out", out.data(), 512}}),
              kLaunchFailed,
              {"64 threads wait at barrier 1, which expects 32"});
  count = 48;
  expectError(launch("named_barriers", 128, params, {{"out", out.data(), 512}}),
              kLaunchFailed, {"bar.sync with 48 threads"});
}

/// A barrier orders the reads before it for good: a thread that reads
/// after it and then writes races with none of them. A warp whose lanes
/// wait at two named barriers is an error (bar.sync is .aligned).
TEST_F(EmulatorChecks, BarriersOrderEarlierReadsAndWholeWarps) {
  ASSERT_EQ(load("barrier_orders"), 0);
  uint32_t out = 0;
  void *pointer = &out;
  ASSERT_EQ(launch("shared_reread", 64, {&pointer}, {{"out", &out, 4}}), 0)
      << message(kLaunchFailed);
  EXPECT_EQ(out, 8u);
  expectError(launch("split_named", 32, {}), kLaunchFailed,
              {"a warp split at barrier 1: thread (16, 0, 0) is not at this "
               "bar.sync"});
}

TEST_F(EmulatorChecks, BarrierOnlySomeThreadsReach) {
  ASSERT_EQ(load("partial_barrier"), 0);
  expectError(launch("partial_barrier", 64, {}), kLaunchFailed,
              {"barrier reached by only some threads",
               "thread (0, 0, 0) exited without reaching it",
               "kernel partial_barrier, block (0, 0, 0), thread (16, 0, 0)",
               "`bar.sync \t0;`"});
}

TEST_F(EmulatorChecks, UninitializedRegister) {
  ASSERT_EQ(load("uninitialized_register"), 0);
  std::vector<uint32_t> out(32);
  void *pointer = out.data();
  expectError(launch("uninitialized_register", 32, {&pointer},
                     {{"out", out.data(), 128}}),
              kLaunchFailed,
              {"read of uninitialized register %r2",
               "thread (0, 0, 0)", "PTX line 14: `add.s32 \t%r3, %r2, 1;`"});
}

TEST_F(EmulatorChecks, UnknownInstructionIsAParseError) {
  expectError(load("unknown_instruction"), kInvalidPtx,
              {"PTX line 11: not implemented by the emulator: "
               "`brev.b32 \t%r2, %r1;` (in unknown_instruction)"});
  module = nullptr;
}

TEST_F(EmulatorChecks, MisalignedVectorLoad) {
  ASSERT_EQ(load("misaligned_load"), 0);
  std::vector<uint32_t> in(8), out(1);
  void *input = in.data(), *output = out.data();
  expectError(launch("misaligned_load", 1, {&input, &output},
                     {{"in", in.data(), 32}, {"out", out.data(), 4}}),
              kMisalignedAddress, {"misaligned global load of 16 bytes"});
}

TEST_F(EmulatorChecks, SharedOutOfBounds) {
  ASSERT_EQ(load("shared_out_of_bounds"), 0);
  expectError(launch("shared_out_of_bounds", 32, {}), kIllegalAddress,
              {"out-of-bounds shared store of 4 bytes at shared address 64",
               "'slots' [0, 64)", "thread (16, 0, 0)"});
}

TEST_F(EmulatorChecks, ShuffleReadingAnExitedLane) {
  ASSERT_EQ(load("shuffle_exited"), 0);
  expectError(launch("shuffle_exited", 32, {}), kLaunchFailed,
              {"shfl.sync reads lane 0, which has exited", "thread (1, 0, 0)"});
}

/// PTX: shfl.sync waits for the non-exited lanes of its membermask; lanes
/// past the end of a partial warp count as exited.
TEST_F(EmulatorChecks, ShuffleWithExitedLanesItDoesNotRead) {
  ASSERT_EQ(load("shuffle_exited_unread"), 0);
  for (unsigned threads : {32u, 16u, 48u}) {
    SCOPED_TRACE(threads);
    std::vector<uint32_t> out(48, 0);
    void *pointer = out.data();
    ASSERT_EQ(launch("shuffle_exited_unread", threads, {&pointer},
                     {{"out", out.data(), out.size() * 4}}),
              0)
        << message(kLaunchFailed);
    // Lane l of each warp writes out[l]: lane 0's 0 plus lane (l ^ 8)'s.
    for (uint32_t lane = 0; lane < out.size(); ++lane)
      EXPECT_EQ(out[lane], lane < 16 ? 10 * (lane ^ 8) : 0) << lane;
  }
}

TEST_F(EmulatorChecks, DeadlockBetweenShuffleAndBarrier) {
  ASSERT_EQ(load("shuffle_barrier_deadlock"), 0);
  expectError(launch("shuffle_barrier_deadlock", 32, {}), kLaunchFailed,
              {"deadlock: shfl.sync (membermask 0xffffffff) can never "
               "complete",
               "lane 16, which waits at bar.sync (PTX line 14)"});
}

TEST_F(EmulatorChecks, LaunchesOutsideTheKernelsLimits) {
  ASSERT_EQ(load("oob_store"), 0);
  std::vector<uint32_t> out(2048);
  void *pointer = out.data();
  expectError(launch("oob_store", 2048, {&pointer},
                     {{"out", out.data(), out.size() * 4}}),
              1, {"invalid launch grid"});
  // Dimensions whose product wraps to a valid count, and grids of more
  // blocks than the emulator counts: refused, not run in part.
  void *function = nullptr;
  ASSERT_EQ(cuModuleGetFunction(&function, module, "oob_store"), 0);
  void *params[] = {&pointer};
  expectError(cuLaunchKernel(function, 1, 1, 1, 0x80000001u, 2, 1, 0, nullptr,
                             params, nullptr),
              1, {"invalid launch grid 1x1x1, block 2147483649x2x1"});
  expectError(cuLaunchKernel(function, 65536, 65536, 1, 32, 1, 1, 0, nullptr,
                             params, nullptr),
              1, {"invalid launch grid 65536x65536x1"});
}

/// Addresses near 2^64: an access that would wrap around the address space
/// is out of bounds (it used to pass the check and crash the host).
TEST_F(EmulatorChecks, AccessesWrappingAroundTheAddressSpace) {
  ASSERT_EQ(load("address_wrap"), 0);
  std::vector<uint64_t> out(4);
  void *pointer = out.data();
  expectError(launch("global_wrap", 1, {&pointer}, {{"out", out.data(), 32}}),
              kIllegalAddress,
              {"out-of-bounds global store of 8 bytes at 0xfffffffffffffff8"});
  expectError(launch("shared_wrap", 1, {}), kIllegalAddress,
              {"out-of-bounds shared store of 8 bytes at shared address "
               "18446744073709551608"});
}

/// Races through accesses of different widths that overlap in part.
TEST_F(EmulatorChecks, RaceThroughPartlyOverlappingAccesses) {
  ASSERT_EQ(load("shared_overlap_race"), 0);
  uint16_t out = 0;
  void *pointer = &out;
  uint32_t synchronized = 0;
  expectError(launch("shared_overlap_race", 32, {&pointer, &synchronized},
                     {{"out", &out, 2}}),
              kLaunchFailed,
              {"shared-memory race on byte 2 of 'slots': thread (0, 0, 0) "
               "wrote it",
               "thread (1, 0, 0)", "ld.shared.u16"});
  synchronized = 1;
  ASSERT_EQ(launch("shared_overlap_race", 32, {&pointer, &synchronized},
                   {{"out", &out, 2}}),
            0)
      << message(kLaunchFailed);
  EXPECT_EQ(out, 0x1234);
}

/// Each block has its own shared memory: the same address in two blocks is
/// no race, whichever host threads run them.
TEST_F(EmulatorChecks, BlocksHaveSeparateSharedMemory) {
  ASSERT_EQ(load("shared_per_block"), 0);
  void *function = nullptr;
  ASSERT_EQ(cuModuleGetFunction(&function, module, "shared_per_block"), 0);
  for (unsigned hostThreads : {1u, 2u}) {
    tilefuse::emulator::setHostThreads(hostThreads);
    std::vector<uint32_t> out(8, 99);
    void *pointer = out.data();
    void *params[] = {&pointer};
    TilefuseEmulatorBuffer buffer{"out", out.data(), out.size() * 4};
    tilefuseEmulatorSetBuffers(&buffer, 1);
    ASSERT_EQ(
        cuLaunchKernel(function, 8, 1, 1, 1, 1, 1, 0, nullptr, params, nullptr),
        0)
        << message(kLaunchFailed);
    for (uint32_t block = 0; block < 8; ++block)
      EXPECT_EQ(out[block], block);
  }
  tilefuse::emulator::setHostThreads(0);
}

/// Resident blocks per SM from threads, blocks and shared memory (the
/// emulated H200: 2048 threads, 32 blocks, 228 KiB, 1 KiB reserved a block).
TEST_F(EmulatorChecks, OccupancyFromThreadsAndSharedMemory) {
  ASSERT_EQ(load("shared_per_block"), 0);
  void *function = nullptr;
  ASSERT_EQ(cuModuleGetFunction(&function, module, "shared_per_block"), 0);
  auto occupancy = [&](int threads, size_t dynamicBytes) {
    int blocks = -1;
    EXPECT_EQ(cuOccupancyMaxActiveBlocksPerMultiprocessor(
                  &blocks, function, threads, dynamicBytes),
              0);
    return blocks;
  };
  EXPECT_EQ(occupancy(32, 0), 32);           // the block limit
  EXPECT_EQ(occupancy(256, 0), 8);           // 2048 threads
  EXPECT_EQ(occupancy(256, 64 * 1024), 3);   // 228 KiB / (64 KiB + ...)
  EXPECT_EQ(occupancy(512, 200 * 1024), 1);  // a staged row
  int blocks = -1;
  EXPECT_EQ(cuOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, function,
                                                        2048, 0),
            kInvalidValue);
  EXPECT_NE(message(kInvalidValue).find("block size 2048"), std::string::npos);
}

/// The registers a benchmark gave a function, and under `.minnctapersm`
/// at most what that many blocks of its `.maxntid` leave (then the spills
/// it gave): occupancy and cuFuncGetAttribute (NUM_REGS 4, LOCAL_SIZE 3).
TEST_F(EmulatorChecks, RegistersUnderMinBlocksPerSM) {
  auto function = [&](bool asking) {
    std::string ptx = std::string(".version 8.0\n.target sm_90\n"
                                  ".address_size 64\n"
                                  ".visible .entry regs()\n"
                                  ".maxntid 256, 1, 1\n") +
                      (asking ? ".minnctapersm 4\n" : "") + "{\n\tret;\n}\n";
    if (module)
      cuModuleUnload(module);
    EXPECT_EQ(cuModuleLoadData(&module, ptx.c_str()), 0) << message(1);
    void *loaded = nullptr;
    EXPECT_EQ(cuModuleGetFunction(&loaded, module, "regs"), 0);
    return loaded;
  };
  auto describe = [](void *loaded) {
    int blocks = -1, registers = -1, local = -1;
    EXPECT_EQ(
        cuOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, loaded, 256, 0),
        0);
    EXPECT_EQ(cuFuncGetAttribute(&registers, 4, loaded), 0);
    EXPECT_EQ(cuFuncGetAttribute(&local, 3, loaded), 0);
    return std::tuple{blocks, registers, local};
  };
  // What the benchmark gave: plain, and asking for 4.
  tilefuse::emulator::setRegisters("regs", {80, 0}, {{4, {64, 24}}});
  EXPECT_EQ(describe(function(false)), std::tuple(3, 80, 0));
  EXPECT_EQ(describe(function(true)), std::tuple(4, 64, 24));
  // Nothing given for 4: at most what 4 blocks of 8 warps leave (64), no
  // spills; a function that fits keeps its registers.
  tilefuse::emulator::setRegisters("regs", {80, 0});
  EXPECT_EQ(describe(function(true)), std::tuple(4, 64, 0));
  tilefuse::emulator::setRegisters("regs", {48, 0});
  EXPECT_EQ(describe(function(true)), std::tuple(5, 48, 0));
  tilefuse::emulator::setRegisters("regs", {});
  int value = -1;
  EXPECT_EQ(cuFuncGetAttribute(&value, 8, function(true)), kInvalidValue);
  EXPECT_NE(message(kInvalidValue).find("function attribute 8 is not emulated"),
            std::string::npos);
}

/// As the driver refuses it (CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES): a block
/// whose registers, as ptxas gave them, do not fit an SM's 64K. A PTX
/// without a block size lets ptxas take more than 128 registers a thread,
/// which 512 threads cannot have (layer_norm_bwd f32 n = 12288 took 136).
TEST_F(EmulatorChecks, BlocksWhoseRegistersDoNotFitAreRefused) {
  const char *ptx = ".version 8.0\n.target sm_90\n.address_size 64\n"
                    ".visible .entry unbounded()\n{\n\tret;\n}\n";
  ASSERT_EQ(cuModuleLoadData(&module, ptx), 0) << message(1);
  void *function = nullptr;
  ASSERT_EQ(cuModuleGetFunction(&function, module, "unbounded"), 0);
  tilefuse::emulator::setRegisters("unbounded", {136, 0});
  expectError(cuLaunchKernel(function, 1, 1, 1, 512, 1, 1, 0, nullptr, nullptr,
                             nullptr),
              kLaunchOutOfResources,
              {"unbounded: a block of 512 threads with 136 registers a thread "
               "and 0 bytes of shared memory does not fit on an SM"});
  EXPECT_EQ(cuLaunchKernel(function, 1, 1, 1, 384, 1, 1, 0, nullptr, nullptr,
                           nullptr),
            0)
      << "12 warps of 136 registers fit";
  tilefuse::emulator::setRegisters("unbounded", {});
}

/// A failed call stays on record until taken, whatever the caller made of
/// its result (the traffic benchmark fails on one CudaDriver recovered
/// from).
TEST_F(EmulatorChecks, FailedCallsAreKeptUntilTaken) {
  tilefuse::emulator::takeFailedCalls();
  void *unloaded = nullptr;
  EXPECT_EQ(cuModuleLoadData(&unloaded, ".version 8.0\n.target sm_90\nbogus"),
            kInvalidPtx);
  int value = -1;
  EXPECT_EQ(cuFuncGetAttribute(&value, 4, nullptr), kInvalidHandle);
  std::vector<std::string> failed = tilefuse::emulator::takeFailedCalls();
  ASSERT_EQ(failed.size(), 2u);
  EXPECT_NE(failed[1].find("null function"), std::string::npos) << failed[1];
  EXPECT_TRUE(tilefuse::emulator::takeFailedCalls().empty());
}

/// Blocks by registers as cuda_occupancy.h counts them: 16K registers in
/// each quarter of the SM, 256 a unit per warp, a block checked as if its
/// warps were a multiple of 4.
TEST_F(EmulatorChecks, OccupancyFromRegistersPerQuarter) {
  using tilefuse::emulator::residentBlocks;
  EXPECT_EQ(residentBlocks(256, 80, 0), 3); // 6 warps a quarter, 8 a block
  EXPECT_EQ(residentBlocks(256, 64, 0), 4);
  EXPECT_EQ(residentBlocks(64, 200, 0), 4);  // 2 warps a quarter (not 5)
  EXPECT_EQ(residentBlocks(96, 168, 0), 4);  // 3 warps a quarter, 3 a block
  EXPECT_EQ(residentBlocks(480, 136, 0), 0); // 15 warps counted as 16
  EXPECT_EQ(residentBlocks(1024, 72, 0), 0);
  EXPECT_EQ(residentBlocks(256, 0, 0), 8); // registers unknown
}

/// bar.sync is barrier.sync.aligned: warps at different bar.sync
/// instructions never meet.
TEST_F(EmulatorChecks, WarpsAtDifferentBarriers) {
  ASSERT_EQ(load("split_barrier"), 0);
  expectError(launch("split_barrier", 64, {}), kLaunchFailed,
              {"threads wait at different barriers: thread (32, 0, 0) at PTX "
               "line 14"});
}

/// No false alarm for registers written on every path through predicated
/// moves and around a loop's back edge.
TEST_F(EmulatorChecks, RegistersWrittenOnEveryPathAreDefined) {
  ASSERT_EQ(load("defined_registers"), 0);
  std::vector<uint32_t> out(32);
  void *pointer = out.data();
  ASSERT_EQ(
      launch("defined_registers", 32, {&pointer}, {{"out", out.data(), 128}}),
      0)
      << message(kLaunchFailed);
  for (uint32_t i = 0; i < 32; ++i)
    EXPECT_EQ(out[i], (i % 2 ? 1u : 2u) + 12) << i;
}

/// A loop or a recursion without end is an error, not a hang or an
/// exhausted host.
TEST_F(EmulatorChecks, RunawayLoopsAndRecursions) {
  ASSERT_EQ(load("runaway"), 0);
  tilefuse::emulator::setBlockInstructionBudget(1 << 20);
  expectError(launch("spin", 64, {}), kLaunchFailed,
              {"runaway block: it ran 1048576 thread-instructions without "
               "completing",
               "`bra.uni \t$LOOP;`"});
  tilefuse::emulator::setBlockInstructionBudget(0);
  expectError(launch("recursion", 64, {}), kLaunchFailed,
              {"calls nested deeper than 1024"});
}

/// Declarations past what a GPU has, and nesting past what the parser
/// recurses into, are refused when the module loads, not allocated or
/// overflowed.
TEST_F(EmulatorChecks, ModulesPastTheLimitsAreRefused) {
  auto module = [](const std::string &body, const std::string &params = "") {
    return ".version 8.0\n.target sm_80\n.address_size 64\n.visible "
           ".entry k(" +
           params + ")\n{\n" + body + "\nret;\n}\n";
  };
  struct Case {
    std::string ptx, error;
  };
  const Case cases[] = {
      {module(".shared .align 1 .b8 a[4294967280];\n.shared .b8 b[32];"),
       "a .shared array of 4294967280 1-byte elements exceeds 49152 bytes"},
      {module(".shared .b8 a[40000];\n.shared .b8 b[10000];"),
       "the .shared arrays up to 'b' take 50000 bytes"},
      {module("", ".param .align 1 .b8 p[4294967295], .param .b32 q"),
       "a .param variable of 4294967295 1-byte elements exceeds"},
      {module("", ".param .align 4 .b8 p[32768]"),
       ".param p ends at byte 32768"},
      {module(".shared .align 3 .b8 a[4];"), ".align 3: not a power of two"},
      {module(std::string(100, '{') + std::string(100, '}')),
       "nested deeper than 64 levels"},
      {module("$L:\n$L:"), "label $L defined twice"},
      {module(".reg .pred %p<2>;\n.reg .b32 %r<2>;\nsetp.eq.u8 %p1, %r1, "
              "%r1;"),
       "unsupported setp type"},
  };
  for (const Case &c : cases) {
    void *refused = nullptr;
    expectError(cuModuleLoadData(&refused, c.ptx.c_str()), kInvalidPtx,
                {c.error.c_str()});
  }
  // A register range far larger than the registers used costs nothing.
  void *loaded = nullptr;
  ASSERT_EQ(
      cuModuleLoadData(&loaded, module(".reg .b32 %r<4000000000>;\nmov.u32 "
                                       "%r3999999999, 1;")
                                    .c_str()),
      0)
      << message(kInvalidPtx);
  cuModuleUnload(loaded);
}

/// Module-scope .global and .const variables (module_variables.ptx):
/// initialized as declared, zero past their initializers, addressed by name,
/// through registers and cvta; each loaded module has its own, and they keep
/// their values between launches.
TEST_F(EmulatorChecks, ModuleVariables) {
  ASSERT_EQ(load("module_variables"), 0) << message(kInvalidPtx);
  std::vector<uint64_t> out(10, 0);
  void *pointer = out.data();
  for (uint64_t count : {1u, 2u}) {
    ASSERT_EQ(launch("read_variables", 1, {&pointer},
                     {{"out", out.data(), out.size() * 8}}),
              0)
        << message(kLaunchFailed);
    EXPECT_EQ(out[9], count) << "launches counted in a .global variable";
  }
  const uint64_t expected[] = {
      0x80FF,             // bytes[2..3] = {255, 128}
      0,                  // bytes[4..5]: past the initializer
      0xFFFFFFFF,         // words[1], through a register
      0xFFFFFFFE,         // words[2], through cvta.global
      0,                  // words[3]: past the initializer
      0xFED4,             // .s16 -300
      0x3F800000,         // .f32 0f3F800000
      0xBFE0000000000000, // ld.const [halves+8]
      0x3FE0000000000000, // ld.const through a register
  };
  for (size_t i = 0; i < std::size(expected); ++i)
    EXPECT_EQ(out[i], expected[i]) << "slot " << i;
  // The variables' traffic is counted like a buffer's.
  std::vector<tilefuse::emulator::LaunchRecord> launches =
      tilefuse::emulator::takeLaunches();
  ASSERT_FALSE(launches.empty());
  bool counted = false;
  for (const tilefuse::emulator::BufferTraffic &buffer :
       launches.back().buffers)
    if (buffer.name == "words") {
      EXPECT_EQ(buffer.loadedBytes, 12u);
      counted = true;
    }
  EXPECT_TRUE(counted);

  // A second copy of the module starts from the initializers.
  void *first = module;
  ASSERT_EQ(load("module_variables"), 0);
  ASSERT_EQ(launch("read_variables", 1, {&pointer},
                   {{"out", out.data(), out.size() * 8}}),
            0);
  EXPECT_EQ(out[9], 1u);
  cuModuleUnload(first);

  // Accesses are checked against each variable like a buffer.
  uint32_t index = 3;
  EXPECT_EQ(launch("overrun", 1, {&index}), 0) << message(kIllegalAddress);
  index = 4;
  expectError(launch("overrun", 1, {&index}), kIllegalAddress,
              {"out-of-bounds global load of 4 bytes",
               "0 bytes past the end of buffer 'words' (16 bytes",
               "kernel overrun, block (0, 0, 0), thread (0, 0, 0)",
               "`ld.global.u32 \t%r2, [%rd3];`"});
  expectError(launch("const_as_global", 1, {}), kIllegalAddress,
              {"a global load of 8 bytes", "in .const variable 'halves'",
               "kernel const_as_global"});
  index = 3;
  EXPECT_EQ(launch("local_overrun", 1, {&index}), 0) << message(kIllegalAddress);
  index = 4;
  expectError(launch("local_overrun", 1, {&index}), kIllegalAddress,
              {"out-of-bounds local store of 4 bytes at local address 16: "
               "the function's .local arrays take 16 bytes",
               "kernel local_overrun", "`st.local.u32 \t[%rd3], %r1;`"});
}

/// Forms of variables and carry arithmetic the emulator does not implement
/// are refused with the line; a carry read before any .cc is an
/// uninitialized register.
TEST_F(EmulatorChecks, UnsupportedVariablesAreRefused) {
  auto ptx = [](const std::string &variables, const std::string &body) {
    return ".version 8.0\n.target sm_90\n.address_size 64\n" + variables +
           "\n.visible .entry k()\n{\n.reg .b32 %r<3>;\n.reg .b64 %rd<3>;\n" +
           body + "\nret;\n}\n";
  };
  struct Case {
    std::string ptx, error;
  };
  const Case cases[] = {
      {ptx(".global .f32 x = 1.5;", ""),
       "PTX line 4: x: unsupported initializer '1.5' for a .32-bit float"},
      {ptx(".global .u8 x = 256;", ""), "unsupported initializer '256'"},
      {ptx(".global .u8 x[2] = {1, 2, 3};", ""),
       "PTX line 4: .global x: 3 bytes of initializer for 2 bytes"},
      {ptx(".global .u64 y;\n.global .u64 x = {generic(y)};", ""),
       "PTX line 5: x: unsupported initializer 'generic'"},
      {ptx(".extern .global .u32 x;", ""),
       "PTX line 4: .extern .global variables are not supported"},
      {ptx(".global .u32 x[2][2];", ""),
       "multidimensional arrays are not supported"},
      {ptx(".global .u32 x;\n.const .u32 x;", ""), "x declared twice"},
      {ptx(".const .b8 x[65537];", ""),
       "a .const array of 65537 1-byte elements exceeds 65536 bytes"},
      {ptx(".global .u32 x;", "mov.u32 %r1, x;"),
       "PTX line 9: a .global address needs a 64-bit operand: "
       "`mov.u32 %r1, x;` (in k)"},
      {ptx(".global .u32 x;", "ld.shared.u32 %r1, [x];"),
       "x is a .global variable, not .shared"},
      {ptx(".const .u32 x;", "st.const.u32 [x], 1;"),
       ".const variables are read-only"},
      {ptx(".const .u32 x;", "cvta.global.u64 %rd1, x;"),
       "x is a .const variable, not .global"},
      {ptx("", ".local .u32 a = 1;"),
       "initialized .local variables are not supported"},
      {ptx("", "addc.cc.b32 %r1, %r1, 1;"),
       "carry arithmetic is add, sub and mad.lo/.hi with .cc"},
      {ptx("", "shf.l.b32 %r1, %r1, %r1, 1;"),
       "only shf.{l,r}.{wrap,clamp}.b32 is implemented"},
      {ptx("", "prmt.b64 %rd1, %rd1, %rd1, 1;"),
       "only prmt.b32 (the default mode) is implemented"},
  };
  for (const Case &c : cases) {
    void *refused = nullptr;
    expectError(cuModuleLoadData(&refused, c.ptx.c_str()), kInvalidPtx,
                {c.error.c_str()});
  }
  std::string carry = ptx("", "addc.u32 %r1, 1, 2;");
  ASSERT_EQ(cuModuleLoadData(&module, carry.c_str()), 0)
      << message(kInvalidPtx);
  expectError(launch("k", 1, {}), kLaunchFailed,
              {"read of uninitialized register CC.CF (the carry flag)",
               "`addc.u32 %r1, 1, 2;`"});
}

/// A TILEFUSE_EMULATE_THREADS that is not a thread count fails the launch
/// with the variable named (0 host threads: read at each launch).
TEST_F(EmulatorChecks, InvalidHostThreadsAreNamed) {
  ASSERT_EQ(load("oob_store"), 0);
  std::vector<uint32_t> out(32);
  void *pointer = out.data();
  std::vector<TilefuseEmulatorBuffer> buffers = {{"out", out.data(), 128}};
  tilefuse::emulator::setHostThreads(0);
  for (const char *value : {"two", "0", "-3", "100000", "2.5"}) {
    ASSERT_EQ(setenv("TILEFUSE_EMULATE_THREADS", value, 1), 0);
    expectError(launch("oob_store", 32, {&pointer}, buffers), kInvalidValue,
                {(std::string("TILEFUSE_EMULATE_THREADS=") + value +
                  ": expected the number of host threads")
                     .c_str(),
                 "an integer from 1 to 1024"});
  }
  ASSERT_EQ(setenv("TILEFUSE_EMULATE_THREADS", "2", 1), 0);
  EXPECT_EQ(launch("oob_store", 32, {&pointer}, buffers), 0);
  unsetenv("TILEFUSE_EMULATE_THREADS");
  EXPECT_EQ(launch("oob_store", 32, {&pointer}, buffers), 0);
}

/// Counters of a kernel small enough to count by hand (counters.ptx): 2
/// blocks of 2 warps, 16 instructions per thread.
TEST_F(EmulatorChecks, CountersOfAHandCountedKernel) {
  ASSERT_EQ(load("counters"), 0);
  std::vector<float> in(128, 1.0f), out(2, 0.0f);
  void *input = in.data(), *output = out.data();
  void *function = nullptr;
  ASSERT_EQ(cuModuleGetFunction(&function, module, "counters"), 0);
  TilefuseEmulatorBuffer buffers[] = {{"in", in.data(), 512},
                                      {"out", out.data(), 8}};
  tilefuseEmulatorSetBuffers(buffers, 2);
  tilefuse::emulator::takeLaunches();
  void *params[] = {&input, &output};
  ASSERT_EQ(
      cuLaunchKernel(function, 2, 1, 1, 64, 1, 1, 0, nullptr, params, nullptr),
      0)
      << message(kLaunchFailed);
  EXPECT_EQ(out[0], 2.0f);
  EXPECT_EQ(out[1], 2.0f);
  std::vector<tilefuse::emulator::LaunchRecord> launches =
      tilefuse::emulator::takeLaunches();
  ASSERT_EQ(launches.size(), 1u);
  const tilefuse::emulator::LaunchRecord &record = launches[0];
  using Class = tilefuse::emulator::InstructionClass;
  const uint64_t threads = 128;
  EXPECT_EQ(record.instructions[size_t(Class::Memory)], 4 * threads);
  EXPECT_EQ(record.instructions[size_t(Class::Arithmetic)], 8 * threads);
  EXPECT_EQ(record.instructions[size_t(Class::Sync)], 2 * threads);
  EXPECT_EQ(record.instructions[size_t(Class::Conversion)], 1 * threads);
  EXPECT_EQ(record.instructions[size_t(Class::Control)], 1 * threads);
  EXPECT_EQ(record.totalInstructions(), 16 * threads);
  EXPECT_EQ(record.barriers, 2u) << "one per block";
  EXPECT_EQ(record.shuffles, 4u) << "one per warp";
  ASSERT_EQ(record.buffers.size(), 2u);
  EXPECT_EQ(record.buffers[0].name, "in");
  EXPECT_EQ(record.buffers[0].loadedBytes, 2 * 512u) << "each block reads all";
  EXPECT_EQ(record.buffers[0].loads, threads);
  EXPECT_EQ(record.buffers[0].storedBytes, 0u);
  EXPECT_EQ(record.buffers[1].name, "out");
  EXPECT_EQ(record.buffers[1].storedBytes, 8u);
  EXPECT_EQ(record.buffers[1].stores, 2u);
  EXPECT_EQ(record.buffers[1].loadedBytes, 0u);
}

TEST_F(EmulatorChecks, InstructionsComputeWhatThePtxIsaDefines) {
  ASSERT_EQ(load("semantics"), 0);
  std::vector<uint64_t> out(46, 0);
  void *pointer = out.data();
  ASSERT_EQ(launch("semantics", 1, {&pointer},
                   {{"out", out.data(), out.size() * 8}}),
            0)
      << message(kLaunchFailed);
  const uint64_t expected[] = {
      0x34800000, // fma.rn: the tie 2^-22 + 2^-46 goes to even
      0x34800001, // fma.rp: up
      0x34800000, // fma.rm: down
      0x3F800002, // fma.rz of 1 + 2^-22 + 2^-46
      0x3F800003, // fma.rp of the same
      0x3F7FFFFF, // add.rm: 1 - 2^-30 down to 1 - 2^-24
      0xBF7FFFFF, // add.rz: -1 + 2^-30 toward zero
      0x3F804000, // cvt.rn.bf16x2.f32 1, 2: the first source is high
      0x3C00C000, // cvt.rn.f16x2.f32 1, -2
      0x7FFFFFFF, // max.NaN with a NaN: the canonical NaN
      0x3F800000, // max with a NaN: the other operand
      0x80000000, // min(+0, -0) = -0
      0x00000000, // max(-0, +0) = +0
      0x00000000, // cvt.rzi.s32.f32 NaN = 0
      0x7FFFFFFF, // cvt.rzi.s32.f32 3e9 saturates
      0x40000000, // cvt.rni 2.5 = 2
      0xC0400000, // cvt.rmi -2.5 = -3
      0x3F800000, // ex2.ftz of a subnormal: 2^0
      0x00000000, // ex2.ftz(-130): a subnormal result, flushed
      0xFFFFFFFF, // bfe.s32 0xF0, 4, 4: sign-extended 0xF
      0x0000000F, // bfe.u32
      0xFFFFFFFF, // shr.s32 -8, 40: clamped, sign-filled
      0x00000000, // shl.b32 1, 40: clamped
      0xFFFFFFFFFFFFFFFF, // mul.hi.s64 -1, 1
      0xFFFFFFFFFFFFFFFA, // mul.wide.s32 -2, 3
      0x3C00, // add.rn.f16 1 + 2^-11: the tie goes to even
      0x3F80, // fma.rn.bf16 1 * 1 + 2^-8: the tie goes to even
      1,      // setp.ltu with a NaN is true
      0xC0000000, // copysign.f32 -1, 2 = -2
      0x3FD5555500000000, // rcp.approx.ftz.f64 3: 1/3, low word zero
      0x5F000001, // cvt.rn.f32.u64 2^63 + 2^39 + 1 rounds up
      0xFFFFFFFD, // div.s32 -7, 2 = -3
      0xFFFFFFFF, // rem.s32 -7, 2 = -1
      42,         // twice(21), a device function
      0x1234,     // mov.b32 {lo, hi}: hi
      0x000000070000002A, // mov.b64 {42, 7}
      0x0000000100000000, // add.cc, addc: the carry into the high word
      0x00000004FFFFFFFF, // sub.cc, subc: the borrow out of it
      0x0000000700000001, // mad.lo.cc, madc.hi
      0xFFFFFFFF,         // madc.hi.s32 -2, 3, 0 after a carry-less add.cc
      0xABCDEF01,         // shf.l.wrap by 36 = 4
      0x9ABCDEF0,         // shf.r.clamp by 40 = 32: b
      0xF0123456,         // shf.r.wrap by 8
      99,                 // a .local array
      0x77334400,         // prmt 0x7340: bytes 0, 4, 3, 7
      0x800000FF,         // prmt 0x0A98: signs of bytes 0 (0x80), 1, 2; byte 0
  };
  for (size_t i = 0; i < std::size(expected); ++i)
    EXPECT_EQ(out[i], expected[i]) << "slot " << i << std::hex << ": got 0x"
                                   << out[i] << ", want 0x" << expected[i];
}

/// Where a discrepancy between the emulator and a GPU would hide a bug:
/// the values the PTX ISA defines for edge cases (test/emulator/
/// edge_cases.ptx). The kernel runs with the host in flush-to-zero mode
/// (as torch.set_flush_denormal(True) leaves it): the emulator must not
/// inherit it.
TEST_F(EmulatorChecks, EdgeCasesComputeWhatThePtxIsaDefines) {
  ASSERT_EQ(load("edge_cases"), 0);
  std::vector<uint64_t> out(50, 0);
  void *pointer = out.data();
  {
    HostFlushesSubnormals flushing;
    ASSERT_EQ(launch("edge_cases", 1, {&pointer},
                     {{"out", out.data(), out.size() * 8}}),
              0)
        << message(kLaunchFailed);
  }
  const uint64_t expected[] = {
      0x80000000, // add.rm 1 + -1: an exact zero sum rounding down is -0
      0x80000000, // fma.rm 1 * 1 - 1
      0x80000000, // sub.rm 2 - 2
      0x00000000, // add.rp 1 + -1: +0
      0x00000000, // div.approx 1 / 2^127: 0 for 2^126 < |b| < 2^128
      0x7FFFFFFF, // div.approx Inf / -2^127: NaN
      0x3F800000, // div.full 2^127 / 2^127 = 1
      0,          // cvt.rzi.u16.f32 NaN = 0
      0x80000000, // cvt.rzi.s32.f64 NaN: an f64 source gives 1 << 31
      0x8000000000000000, // cvt.rzi.u64.f32 NaN: a 64-bit destination
      0x8000000000000000, // cvt.rzi.s64.f64 NaN
      0xFFFFFFFE,         // cvt.rni.s32.f32 -2.5 = -2 (ties to even)
      0,                  // cvt.rpi.u32.f32 -0.5: -0, clamped to 0
      0xFF,               // cvt.rzi.u8.f32 300 saturates, zero-extended
      0xFFFFFF80,         // cvt.rzi.s8.f32 -300 saturates, sign-extended
      0x7C00,             // cvt.rn.f16.f32 65520: the tie goes to Inf
      0x7BFF,             // cvt.rz.f16.f32 1e6: the largest finite
      0,                  // cvt.rn.f32.f64 2^-150: the tie goes to even, 0
      0x3F800000,         // cvt.sat 2 = 1
      0,                  // cvt.sat NaN = +0
      0,                  // setp.ne NaN, 1 is false
      1,                  // setp.gtu NaN, 1 is true
      0,                  // setp.neu 1, 1 is false
      0,                  // setp.num 1, NaN is false
      0,                  // shl.b64 1, 64
      0xFFFFFFFFFFFFFFFF, // shr.s64 -2, 200: sign-filled
      0,                  // shr.u16 0x8001, 16
      0xFFFFFFFE00000001, // mul.wide.u32 (2^32 - 1)^2
      0xFFFFFFFE,         // mul.hi.u32 (2^32 - 1)^2
      3,                  // mad.hi.u64 (2^64 - 1)^2 + 5, wrapped
      88,                 // mad.wide.s32 -3 * 4 + 100
      0,                  // bfe.u32 from bit 40: zeros
      0xFFFFFFFF,         // bfe.s32 from bit 31: its sign replicated
      0,                  // bfe.s64 of length 0
      0x00000002,         // add.f32 of two subnormals keeps them
      0x00000000,         // add.ftz.f32 flushes subnormal inputs
      0x00000000,         // mul.ftz.f32 2^-126 * 0.5 flushes the result
      0x00000000,         // max.ftz.f32 -tiny, +tiny: max(-0, +0) = +0
      0x00000000,         // ex2.approx.ftz -Inf = +0
      0xFF800000,         // lg2.approx -0 = -Inf
      0xFF800000,         // rsqrt.approx -0 = -Inf
      0x7F800000,         // rcp.approx.ftz of a subnormal: 1 / +0
      0x80000000,         // sqrt.rn -0 = -0
      0x8000000000000000, // add.rm.f64 1 + -1 = -0
      0x3FB9999999999999, // div.rz.f64 1 / 10 (.rn rounds up to ...9A)
      0x000000050000004D, // 77 and 5
      77,                 // loaded through [%rd + -8]
      72,                 // .v2: the first element is the low word
      0x38004000,         // ex2.approx.f16x2 {1, -1}: {2, 0.5}
      0x3F804000,         // ex2.approx.ftz.bf16x2 {1, tiny}: {2, 1}
  };
  for (size_t i = 0; i < std::size(expected); ++i)
    EXPECT_EQ(out[i], expected[i]) << "slot " << i << std::hex << ": got 0x"
                                   << out[i] << ", want 0x" << expected[i];
}

/// What an f32 .approx instruction must return under `mode`: Exact, the
/// exact result rounded to nearest; High/Low, the farthest float above/below
/// it within `bound`, stopping at a zero of its sign; results that round to
/// 0, infinity or NaN as they are; then flushed if `ftz`.
float expectedApproximation(tilefuse::emulator::Approximation mode,
                            double exact, double bound, bool ftz) {
  using tilefuse::emulator::Approximation;
  float result = static_cast<float>(exact);
  if (mode != Approximation::Exact && std::isfinite(result) && result != 0 &&
      std::fabs(exact) > 0x1p-150) {
    bool up = mode == Approximation::High;
    double moved = up ? exact + bound : exact - bound;
    if (std::signbit(moved) != std::signbit(exact) || moved == 0) {
      result = std::copysign(0.0f, result);
    } else {
      result = static_cast<float>(moved);
      if (up ? result > moved : result < moved)
        result = std::nextafter(result, up ? -INFINITY : INFINITY);
    }
  }
  if (ftz && std::fpclassify(result) == FP_SUBNORMAL)
    result = std::copysign(0.0f, result);
  return result;
}

/// Restores Exact when a test that changed the mode ends.
struct ExactAfterwards {
  ~ExactAfterwards() {
    tilefuse::emulator::setApproximation(
        tilefuse::emulator::Approximation::Exact);
  }
};

/// The f32 .approx instructions under each Approximation, on the fast and
/// the generic paths: Exact rounds the exact result to nearest; High and
/// Low move it by PTX's whole bound (2 ulp for ex2 and div, 1 for rcp,
/// 2^-22.9 and 2^-23 relative for rsqrt and sqrt), never past it, never
/// across zero, never off infinity, zero or NaN, and never ex2's exact 1
/// (of +-0 and subnormals, the ISA's special cases).
TEST_F(EmulatorChecks, ApproximationsMoveByThePtxBound) {
  using tilefuse::emulator::Approximation;
  ExactAfterwards restore;
  ASSERT_EQ(load("approximations"), 0);
  // Positive arguments, then negative ones, results that overflow,
  // underflow to subnormals or zero, and infinities.
  std::vector<float> in;
  for (float x = 0.01f; x < 40; x *= 1.37f)
    in.push_back(x);
  for (float x : {-3.5f, -0.3f, -130.0f, -149.5f, -200.0f, 128.0f, 200.0f,
                  0x1p-140f, 0.0f, -0.0f, -INFINITY, INFINITY})
    in.push_back(x);
  struct Slot {
    const char *name;
    double (*exact)(double);
    bool relative; // the bound: relative, else in ulps of the exact value
    double bound;
    bool ftz;
  };
  const Slot slots[] = {
      {"ex2", [](double x) { return std::exp2(x); }, false, 2, false},
      {"ex2.ftz", [](double x) { return std::exp2(x); }, false, 2, true},
      {"div.approx", [](double x) { return 3 / x; }, false, 2, false},
      {"rcp.approx.ftz", [](double x) { return 1 / x; }, false, 1, true},
      {"rsqrt", [](double x) { return 1 / std::sqrt(x); }, true,
       std::exp2(-22.9), false},
      {"sqrt", [](double x) { return std::sqrt(x); }, true, std::exp2(-23),
       false},
      {"rcp.approx", [](double x) { return 1 / x; }, false, 1, false},
      {"div.full", [](double x) { return 3 / x; }, false, 2, false},
  };
  for (Approximation mode :
       {Approximation::Exact, Approximation::High, Approximation::Low}) {
    tilefuse::emulator::setApproximation(mode);
    std::vector<float> out(8 * in.size(), 0);
    void *inPointer = in.data(), *outPointer = out.data();
    ASSERT_EQ(launch("approximations", in.size(), {&inPointer, &outPointer},
                     {{"in", in.data(), in.size() * 4},
                      {"out", out.data(), out.size() * 4}}),
              0)
        << message(kLaunchFailed);
    int moved = 0;
    for (size_t i = 0; i < in.size(); ++i)
      for (size_t k = 0; k < std::size(slots); ++k) {
        const Slot &slot = slots[k];
        float x = slot.ftz && std::fpclassify(in[i]) == FP_SUBNORMAL
                      ? std::copysign(0.0f, in[i])
                      : in[i];
        double exact = slot.exact(x);
        // No ulp for 0, infinity or NaN (ilogb: INT_MIN or INT_MAX).
        double ulp =
            exact != 0 && std::isfinite(exact)
                ? std::ldexp(1.0, std::max(std::ilogb(exact) - 23, -149))
                : 0;
        double bound = slot.relative ? slot.bound * std::fabs(exact)
                                     : slot.bound * ulp;
        bool exactOne = std::strncmp(slot.name, "ex2", 3) == 0 && exact == 1;
        float want = exactOne
                         ? 1.0f
                         : expectedApproximation(mode, exact, bound, slot.ftz);
        float got = out[8 * i + k];
        moved += got != static_cast<float>(exact);
        EXPECT_TRUE(got == want || (std::isnan(got) && std::isnan(want)))
            << slot.name << "(" << in[i] << "), mode "
            << static_cast<int>(mode) << ": got " << got << ", want " << want
            << " (exact " << exact << ")";
        if (got == 0 && want == 0)
          EXPECT_EQ(std::signbit(got), std::signbit(want))
              << slot.name << "(" << in[i] << ")";
      }
    if (mode != Approximation::Exact)
      EXPECT_GT(3 * moved, int(2 * std::size(slots) * in.size()))
          << "most results move";
  }
}

TEST_F(EmulatorChecks, ShufflesFollowThePtxIsa) {
  ASSERT_EQ(load("semantics"), 0);
  std::vector<uint32_t> out(128);
  void *pointer = out.data();
  ASSERT_EQ(launch("shuffles", 32, {&pointer}, {{"out", out.data(), 512}}), 0)
      << message(kLaunchFailed);
  for (uint32_t lane = 0; lane < 32; ++lane) {
    SCOPED_TRACE(lane);
    EXPECT_EQ(out[4 * lane], lane == 0 ? 0 : lane - 1) << "up 1";
    EXPECT_EQ(out[4 * lane + 1], lane == 31 ? 31 : lane + 1 + 100)
        << "down 1, and its predicate";
    EXPECT_EQ(out[4 * lane + 2], lane ^ 3) << "bfly 3";
    EXPECT_EQ(out[4 * lane + 3], (lane & 16) | 5)
        << "idx 5 in 16-lane segments";
  }
  std::vector<tilefuse::emulator::LaunchRecord> launches =
      tilefuse::emulator::takeLaunches();
  ASSERT_FALSE(launches.empty());
  EXPECT_EQ(launches.back().shuffles, 4u);
}

} // namespace
