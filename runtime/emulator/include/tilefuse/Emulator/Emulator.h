//===- Emulator.h - the PTX emulator: device, launches ----------*- C++ -*-===//
//
// libtilefuse_emulator.so runs PTX on the host. It exports, with C linkage,
// the CUDA driver entry points CudaDriver resolves (cuInit ...
// cuLaunchKernel), so CudaDriver loads it in place of libcuda.so.1 when
// TILEFUSE_TARGET=emulate (or emulate:sm_80) and the code that talks to the
// real driver is the code under test. Device pointers are host pointers.
//
// Every launch is checked: global accesses outside the buffers the launch
// was given (tilefuseEmulatorSetBuffers), shared accesses outside the
// declared .shared arrays, shared-memory races between barriers, reads of
// registers never written, misaligned accesses, integer division by zero,
// barriers not every thread of a block reaches and shuffles that can never
// complete. A failed check fails cuLaunchKernel with a message (through
// cuGetErrorString) naming the kernel, the PTX line and instruction, the
// block and the thread.
//
// Each launch leaves a LaunchRecord: global bytes per buffer, dynamic
// thread-instructions by class, barriers and shuffles. TILEFUSE_LOG=emulate
// prints one line per launch to stderr.
//
//===----------------------------------------------------------------------===//

#ifndef TILEFUSE_EMULATOR_EMULATOR_H
#define TILEFUSE_EMULATOR_EMULATOR_H

#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

extern "C" {
/// One global buffer a launch may access: [base, base + bytes).
struct TilefuseEmulatorBuffer {
  const char *name;
  const void *base;
  uint64_t bytes;
};

/// The buffers the next cuLaunchKernel on this thread may access (copied;
/// a later call replaces them). Resolved with dlsym by CudaDriver: a real
/// driver does not have it. Returns 0.
int tilefuseEmulatorSetBuffers(const TilefuseEmulatorBuffer *buffers,
                               size_t count);
}

namespace tilefuse::emulator {

/// What a dynamic thread-instruction does (the traffic benchmark's issue
/// model weighs them differently).
enum class InstructionClass : uint8_t {
  Memory,         // ld, st
  Arithmetic,     // integer, f16/bf16/f32 arithmetic, compare, select, logic
  Double,         // f64 arithmetic
  Transcendental, // ex2, lg2, tanh, rsqrt, rcp/sqrt .approx (the SFU)
  Division,       // IEEE div, sqrt, rcp: a multi-instruction sequence on a GPU
  Conversion,     // cvt, pack and unpack moves
  Sync,           // bar.sync, shfl.sync
  Control,        // bra, call, ret
  Count
};
constexpr size_t kInstructionClasses =
    static_cast<size_t>(InstructionClass::Count);
const char *className(InstructionClass kind);

/// Global traffic of one buffer in one launch.
struct BufferTraffic {
  std::string name;
  uint64_t base = 0, bytes = 0;
  uint64_t loadedBytes = 0, storedBytes = 0;
  uint64_t loads = 0, stores = 0; // thread-level access instructions
  /// Under setTrafficDetail(true): distinct 32-byte sectors each block
  /// touched, summed over blocks (what per-block caching would fetch), and
  /// distinct sectors over the whole launch (what a cache holding the whole
  /// buffer would fetch), in bytes.
  uint64_t blockUniqueBytes = 0, launchUniqueBytes = 0;
};

struct LaunchRecord {
  std::string kernel, chip;
  unsigned grid[3] = {1, 1, 1}, block[3] = {1, 1, 1};
  std::vector<BufferTraffic> buffers;
  /// Thread-instructions executed, by class (predicated-off ones too: they
  /// take an issue slot).
  uint64_t instructions[kInstructionClasses] = {};
  /// Barriers completed (once per block per bar.sync; a named barrier
  /// with a thread count once per group of threads that met), the threads
  /// that took part in them, and warp shuffles completed (once per group
  /// of lanes that exchanged).
  uint64_t barriers = 0, barrierThreads = 0, shuffles = 0;
  /// Under setTrafficDetail(true): how many times a thread had to wait for
  /// its outstanding global loads, as a GPU scheduling loads as early as
  /// dependences allow would: at a load whose address, or a store whose
  /// data, one of them produces (later loads cannot pass a store that may
  /// alias), at a branch, barrier, shuffle, call or the end. Loaded bytes
  /// per round trip are the bytes a thread keeps in flight.
  uint64_t loadRoundTrips = 0;
  /// 32-bit registers each thread declares (a .b64 counts twice; ptxas
  /// allocates its own, usually fewer) and static shared bytes per block.
  unsigned declaredRegisters = 0, sharedBytes = 0;
  /// The kernel's `.minnctapersm` (0 when it has none).
  unsigned minBlocksPerSM = 0;
  double seconds = 0;

  uint64_t totalInstructions() const;
  uint64_t loadedBytes() const;
  uint64_t storedBytes() const;
  /// One line: kernel, grid, bytes per buffer, instructions, time.
  std::string summary() const;
};

/// The launches recorded since the last call (oldest first; at most the
/// last 4096 are kept), and forgets them.
std::vector<LaunchRecord> takeLaunches();

/// The messages of the driver calls this thread made that failed since it
/// last asked (the first 64), and forgets them. A caller that recovers from
/// a failure hides it otherwise: CudaDriver keeps the plain module where
/// its second PTX JIT fails (raiseOccupancy).
std::vector<std::string> takeFailedCalls();

/// The emulated chip: "sm_90" (H200-like: 132 SMs) or "sm_80" (A100-like:
/// 108 SMs). cuInit picks it from TILEFUSE_TARGET (emulate or
/// emulate:sm_XX); this overrides it, and `multiprocessors` > 0 overrides
/// the SM count (tests use a few SMs to get persistent grids cheaply).
/// Returns false for an unknown chip.
bool setDevice(const std::string &chip, int multiprocessors = 0);
std::string deviceChip();
int deviceMultiprocessors();

/// Blocks of `threads` threads, each taking `registers` registers (0:
/// unknown, no limit), with `sharedBytes` of shared memory a block, that
/// one SM of the emulated chip holds at once: its limits of 2048 threads,
/// 32 blocks, 64K registers (16K in each quarter of the SM, given out per
/// warp in units of 256, as cuda_occupancy.h counts them) and its shared
/// memory (1 KiB reserved per block). What
/// cuOccupancyMaxActiveBlocksPerMultiprocessor answers.
int residentBlocks(int64_t threads, int registers, int64_t sharedBytes);

/// What ptxas gives a function: registers per thread and bytes of local
/// memory (its spills).
struct PtxasAllocation {
  int registers = 0;
  int localBytes = 0;
};

/// What ptxas gives the functions named `function` (0 registers: unknown,
/// no limit), per `.minnctapersm` value what it gives them where the PTX
/// asks for that many blocks per SM, and per `.maxntid` what it gives them
/// where the plain PTX had no block size and a runtime gave it one. The
/// emulator runs PTX's virtual registers and cannot know them; a benchmark
/// that asked ptxas says them here, for the occupancy and
/// cuFuncGetAttribute. A `.minnctapersm` or such `.maxntid` with no entry
/// gets at most the registers with which that many blocks of its block
/// size (one block) are resident (residentBlocks) and no local memory.
void setRegisters(const std::string &function, PtxasAllocation plain,
                  const std::map<unsigned, PtxasAllocation> &whenAsked = {},
                  const std::map<unsigned, PtxasAllocation> &whenBounded = {});

/// Counts distinct sectors per block and per launch (BufferTraffic). Off
/// by default (it costs memory and time per access).
void setTrafficDetail(bool on);

/// Thread-instructions one block may run before the launch fails as a
/// runaway (0: the default, 2^34, about two minutes of emulation here).
void setBlockInstructionBudget(uint64_t budget);

/// Host threads running independent blocks (0: the default, the
/// hardware's concurrency or TILEFUSE_EMULATE_THREADS). Results and the
/// reported error do not depend on it.
void setHostThreads(unsigned threads);

/// What the f32 `.approx` instructions return. Exact: the exact result
/// rounded to nearest (more accurate than the hardware). High and Low: the
/// exact result moved up or down by the whole error PTX allows (ex2 and div
/// 2 ulp, rcp 1 ulp, rsqrt 2^-22.9 and sqrt 2^-23 relative), rounded
/// toward the exact one: every approximation biased the same way, the
/// worst case for sums of them. f16/bf16 ex2, lg2 and f64 stay exact.
enum class Approximation { Exact, High, Low };

/// The mode for launches from now on; cuInit takes it from
/// TILEFUSE_EMULATE_APPROX (exact, high or low; unset: exact) unless this
/// was called first.
void setApproximation(Approximation mode);

/// The mode named "exact", "high" or "low"; nullopt for any other name.
std::optional<Approximation> parseApproximation(std::string_view name);

} // namespace tilefuse::emulator

#endif // TILEFUSE_EMULATOR_EMULATOR_H
