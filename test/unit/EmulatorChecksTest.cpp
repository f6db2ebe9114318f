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

#include <cstring>

extern "C" {
int cuInit(unsigned);
int cuDevicePrimaryCtxRetain(void **, int);
int cuCtxSetCurrent(void *);
int cuGetErrorName(int, const char **);
int cuGetErrorString(int, const char **);
int cuModuleLoadData(void **, const void *);
int cuModuleGetFunction(void **, void *, const char *);
int cuModuleUnload(void *);
int cuLaunchKernel(void *, unsigned, unsigned, unsigned, unsigned, unsigned,
                   unsigned, unsigned, void *, void **, void **);
}

namespace {

constexpr int kIllegalAddress = 700, kMisalignedAddress = 716,
              kLaunchFailed = 719, kInvalidPtx = 218;

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
               "thread (0, 0, 0) read it at PTX line 27 since the last "
               "barrier, and this thread writes it",
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

TEST_F(EmulatorChecks, ShuffleNamingAnExitedLane) {
  ASSERT_EQ(load("shuffle_exited"), 0);
  expectError(launch("shuffle_exited", 32, {}), kLaunchFailed,
              {"membermask 0xffffffff names lane 0, which has exited"});
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
}

TEST_F(EmulatorChecks, InstructionsComputeWhatThePtxIsaDefines) {
  ASSERT_EQ(load("semantics"), 0);
  std::vector<uint64_t> out(36, 0);
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
  };
  for (size_t i = 0; i < std::size(expected); ++i)
    EXPECT_EQ(out[i], expected[i]) << "slot " << i << std::hex << ": got 0x"
                                   << out[i] << ", want 0x" << expected[i];
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
