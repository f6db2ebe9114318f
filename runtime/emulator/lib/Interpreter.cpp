//===- Interpreter.cpp - run a kernel launch on the host ------------------===//
//
// Each block runs its threads one at a time: a thread runs until it reaches
// bar.sync, shfl.sync or its end (independent thread scheduling, as on
// sm_70 and later; a lowest-program-counter-first scheduler would deadlock
// on LLVM's loops, whose latches precede their headers). A shuffle
// completes when every lane of its member mask waits at one; a barrier when
// every thread of the block waits at it, or, given a thread count, when
// that many (whole warps) wait at its number. When no thread can run and
// some still wait, the block can never complete: that is an error, not a
// hang. Shared-memory races are found with a vector clock per warp: two
// accesses conflict unless a barrier both warps took part in (or a chain
// of them) separates them.
//
// Blocks are independent, so several host threads run different blocks;
// the reported error is the lowest failing block's, whatever ran first.
//
//===----------------------------------------------------------------------===//

#include "Interpreter.h"

#include "Numerics.h"

#include "llvm/ADT/DenseMap.h"
#include "llvm/ADT/SmallVector.h"
#include "llvm/ADT/bit.h"
#include "llvm/Support/FormatVariadic.h"

#include <algorithm>
#include <atomic>
#include <cfenv>
#include <chrono>
#include <climits>
#include <mutex>
#include <thread>
#include <type_traits>
#if defined(__SSE__)
#include <xmmintrin.h>
#endif

using namespace tilefuse::emulator;
using namespace tilefuse::emulator::numerics;

namespace {

//===----------------------------------------------------------------------===//
// Integer semantics per type
//===----------------------------------------------------------------------===//

template <typename T> using Unsigned = std::make_unsigned_t<T>;

/// The low bits of a register as T.
template <typename T> inline T as(uint64_t bits) {
  return static_cast<T>(static_cast<Unsigned<T>>(bits));
}
/// T in a register: sign-extended for signed types, zero-extended otherwise
/// (PTX: "Operand Size Exceeding Instruction-Type Size").
template <typename T> inline uint64_t extend(T value) {
  if constexpr (std::is_signed_v<T>)
    return static_cast<uint64_t>(static_cast<int64_t>(value));
  else
    return static_cast<uint64_t>(value);
}

template <typename T> constexpr unsigned kBits = sizeof(T) * 8;

template <typename T> inline T add(T a, T b) {
  return static_cast<T>(static_cast<Unsigned<T>>(
      static_cast<uint64_t>(static_cast<Unsigned<T>>(a)) +
      static_cast<Unsigned<T>>(b)));
}
template <typename T> inline T sub(T a, T b) {
  return static_cast<T>(static_cast<Unsigned<T>>(
      static_cast<uint64_t>(static_cast<Unsigned<T>>(a)) -
      static_cast<Unsigned<T>>(b)));
}
template <typename T> inline T mulLo(T a, T b) {
  return static_cast<T>(static_cast<Unsigned<T>>(
      static_cast<uint64_t>(static_cast<Unsigned<T>>(a)) *
      static_cast<uint64_t>(static_cast<Unsigned<T>>(b))));
}
template <typename T> inline T mulHi(T a, T b) {
  using Wide = std::conditional_t<std::is_signed_v<T>, __int128,
                                  unsigned __int128>;
  return static_cast<T>((static_cast<Wide>(a) * static_cast<Wide>(b)) >>
                        kBits<T>);
}
/// .wide: the full product in twice the width (16- and 32-bit types).
template <typename T>
using WideOf = std::conditional_t<
    sizeof(T) == 2, std::conditional_t<std::is_signed_v<T>, int32_t, uint32_t>,
    std::conditional_t<std::is_signed_v<T>, int64_t, uint64_t>>;
template <typename T> inline WideOf<T> mulWide(T a, T b) {
  return static_cast<WideOf<T>>(static_cast<WideOf<T>>(a) *
                                static_cast<WideOf<T>>(b));
}
template <typename T> inline T shl(T a, uint32_t amount) {
  if (amount >= kBits<T>)
    return 0;
  return static_cast<T>(static_cast<Unsigned<T>>(
      static_cast<uint64_t>(static_cast<Unsigned<T>>(a)) << amount));
}
template <typename T> inline T shr(T a, uint32_t amount) {
  if (amount >= kBits<T>)
    return std::is_signed_v<T> && a < 0 ? T(-1) : T(0);
  return static_cast<T>(a >> amount); // arithmetic for signed types
}
template <typename T> inline T negate(T a) { return sub<T>(0, a); }
template <typename T> inline T absolute(T a) { return a < 0 ? negate(a) : a; }
template <typename T> inline uint32_t popc(T a) {
  return llvm::popcount(static_cast<Unsigned<T>>(a));
}
template <typename T> inline uint32_t clz(T a) {
  return llvm::countl_zero(static_cast<Unsigned<T>>(a));
}
/// bfe: `len` bits of `a` from `pos`, sign-extended for signed types.
template <typename T> inline T bitfield(T a, uint32_t pos, uint32_t len) {
  pos &= 0xFF;
  len &= 0xFF;
  constexpr unsigned msb = kBits<T> - 1;
  using U = Unsigned<T>;
  U value = static_cast<U>(a);
  bool sign = false;
  if (std::is_signed_v<T> && len != 0)
    sign = (value >> std::min<unsigned>(pos + len - 1, msb)) & 1;
  U result = 0;
  for (unsigned i = 0; i <= msb; ++i) {
    bool bit = (i < len && pos + i <= msb) ? (value >> (pos + i)) & 1 : sign;
    result |= static_cast<U>(bit) << i;
  }
  return static_cast<T>(result);
}
template <typename T> inline bool compareInt(Compare op, T a, T b) {
  switch (op) {
  case Compare::Eq: return a == b;
  case Compare::Ne: return a != b;
  case Compare::Lt: return a < b;
  case Compare::Le: return a <= b;
  case Compare::Gt: return a > b;
  case Compare::Ge: return a >= b;
  default: return false;
  }
}

//===----------------------------------------------------------------------===//
// Threads and blocks
//===----------------------------------------------------------------------===//

constexpr unsigned kCounters = kInstructionClasses + 1; // + inserted checks
constexpr uint16_t kManyThreads = 0xFFFF;
/// Launch::blockInstructionBudget is checked every kRunawayCheckInterval
/// taken branches (every loop takes one).
constexpr uint32_t kRunawayCheckInterval = 256;
/// Device-function calls one thread may nest (with kMaxStackBytes of
/// frames): recursion without end, or a deep one in every thread of a
/// block, stops here instead of exhausting memory.
constexpr size_t kMaxCallDepth = 1024;

struct Frame {
  const Function *fn;
  uint32_t base;     // in Thread::stack
  uint32_t returnPc; // in the caller
  const CallSite *call;
};

enum class Stop : uint8_t { Barrier, Shuffle, Exit, Error };

struct Thread {
  enum class State : uint8_t { Ready, Barrier, Shuffle, Exited };
  State state = State::Ready;
  uint32_t linear = 0;
  uint32_t tid[3] = {0, 0, 0};
  uint32_t pc = 0;
  /// The barrier or shuffle instruction it waits at.
  uint32_t waitPc = 0;
  /// The barrier number it waits at, and its thread count (0: the block).
  uint32_t barrierId = 0, barrierCount = 0;
  std::vector<uint64_t> stack;
  llvm::SmallVector<Frame, 2> frames;
  // What it brought to a shuffle.
  uint32_t shuffleValue = 0, shuffleB = 0, shuffleC = 0, shuffleMask = 0;
  uint8_t shuffleMode = 0;
  /// Traffic detail: registers its outstanding global loads will write.
  llvm::SmallVector<uint32_t, 16> pendingLoads;
};

/// Who last touched a byte of shared memory, and when (BlockRunner::now):
/// the last write, and the reads since it (the warps that read, the latest
/// time; `reader` is the one thread or kManyThreads).
struct Shadow {
  uint32_t writeTime = 0, readTime = 0;
  uint32_t readWarps = 0;
  uint16_t writer = 0, reader = 0;
  uint32_t writeLine = 0, readLine = 0;
};

struct BufferRange {
  uint64_t begin, end;
  unsigned index;
  bool constant; // a .const variable of the module
};

struct Traffic {
  uint64_t loadedBytes = 0, storedBytes = 0, loads = 0, stores = 0;
  uint64_t blockUnique = 0;
  std::vector<uint32_t> blockStamps; // per 32-byte sector: block + 1
  std::vector<uint64_t> launchBits;  // per sector: touched by these blocks
};

/// What every block of a launch shares.
struct Context {
  explicit Context(const Launch &launch)
      : launch(launch), module(*launch.module), kernel(*launch.kernel) {}
  const Launch &launch;
  const Module &module;
  const Function &kernel;
  unsigned threadCount = 0, blockCount = 0;
  uint32_t sharedBytes = 0;
  std::vector<BufferRange> ranges; // sorted by begin
  std::vector<std::string> bufferNames;
  std::vector<uint64_t> bufferBegins, bufferBytes;
  /// 64-bit words of a frame of each function (by index in the module).
  llvm::DenseMap<const Function *, uint32_t> frameWords;
};

/// The host's floating point as the numerics need it, whatever the calling
/// thread set (torch.set_flush_denormal sets FTZ and DAZ): round to nearest,
/// subnormals kept, exceptions masked. Restored when it goes.
class HostFloatingPoint {
public:
  HostFloatingPoint() {
    std::fegetenv(&saved);
    std::fesetenv(FE_DFL_ENV);
#if defined(__SSE__)
    savedControl = _mm_getcsr();
    _mm_setcsr(kDefaultControl);
#endif
  }
  ~HostFloatingPoint() {
    std::fesetenv(&saved);
#if defined(__SSE__)
    _mm_setcsr(savedControl);
#endif
  }
  HostFloatingPoint(const HostFloatingPoint &) = delete;
  HostFloatingPoint &operator=(const HostFloatingPoint &) = delete;

private:
  std::fenv_t saved;
#if defined(__SSE__)
  /// MXCSR: exceptions masked, round to nearest, no FTZ or DAZ.
  static constexpr unsigned kDefaultControl = 0x1F80;
  unsigned savedControl;
#endif
};

class BlockRunner {
public:
  explicit BlockRunner(const Context &context);

  /// Runs block `index` (linear); false when a check failed (`error`).
  bool run(unsigned index);

  uint64_t counts[kCounters] = {};
  uint64_t barriers = 0, barrierThreads = 0, shuffles = 0, roundTrips = 0;
  std::vector<Traffic> traffic;
  std::optional<LaunchError> error;

private:
  /// Runs `thread` until it stops; `Detail` also counts the thread's round
  /// trips to memory (see LaunchRecord::loadRoundTrips).
  template <bool Detail> Stop execute(Thread &thread);
  /// An f32 `.approx` result under the launch's Approximation.
  float approximated(double exact, FloatKind kind) const {
    return static_cast<float>(
        approximate(exact, kind, launch.approximation));
  }
  void endRoundTrip(Thread &thread) {
    if (!thread.pendingLoads.empty()) {
      ++roundTrips;
      thread.pendingLoads.clear();
    }
  }
  void makeFrame(Thread &thread, const Function &fn, uint32_t base);
  bool fail(const Thread &thread, const Function &fn, uint32_t pc, int code,
            const llvm::Twine &what);
  std::string describe(const Thread &thread, const Function &fn,
                       uint32_t pc) const;
  /// A global (or, `constSpace`, a .const) access.
  bool checkGlobal(const Thread &thread, const Function &fn, uint32_t pc,
                   uint64_t address, unsigned bytes, bool store,
                   bool constSpace);
  bool checkShared(const Thread &thread, const Function &fn, uint32_t pc,
                   uint64_t address, unsigned bytes, bool store);
  bool arriveAtShuffle(Thread &thread);
  /// A lane exited: shuffles of its warp may now have every lane they wait
  /// for.
  bool completeShufflesAfterExit(const Thread &exited);
  /// Thread-instructions this runner has executed (every block).
  uint64_t executed() const {
    uint64_t total = 0;
    for (uint64_t value : counts)
      total += value;
    return total;
  }
  bool resolveStalled();
  /// Fails for a read of shared memory no thread wrote before the barrier
  /// (or the end) that closes the interval it happened in.
  bool checkUnwrittenReads() {
    if (!unwrittenRead.thread)
      return true;
    return fail(*unwrittenRead.thread, *unwrittenRead.fn, unwrittenRead.pc,
                kLaunchFailed,
                llvm::formatv("read of uninitialized shared memory: no thread "
                              "of the block wrote {0}",
                              unwrittenRead.where));
  }
  void makeReady(Thread &thread) {
    thread.state = Thread::State::Ready;
    waitingLanes[thread.linear / 32] &= ~(uint32_t(1) << thread.linear % 32);
    ready.push_back(thread.linear);
  }
  void waitAtShuffle(Thread &thread) {
    thread.state = Thread::State::Shuffle;
    waitingLanes[thread.linear / 32] |= uint32_t(1) << thread.linear % 32;
  }
  void markExited(Thread &thread) {
    thread.state = Thread::State::Exited;
    goneLanes[thread.linear / 32] |= uint32_t(1) << thread.linear % 32;
  }

  const Context &context;
  const Launch &launch;
  std::vector<Thread> threads;
  std::vector<uint32_t> ready;
  /// Per warp: the lanes waiting at a shuffle, and those that exited or do
  /// not exist (past the end of a partial warp).
  std::vector<uint32_t> waitingLanes, goneLanes;
  size_t readyHead = 0;
  unsigned blockIndex = 0;
  uint32_t ctaid[3] = {0, 0, 0};
  std::vector<uint8_t> shared;
  std::vector<Shadow> shadow;
  /// Barriers completed by this runner (every block): a shared access is
  /// stamped with it; blockTime is its value when the block started.
  uint32_t now = 0, blockTime = 0;
  /// clocks[w * warps + v]: warp w has seen every access warp v made
  /// before this time (the last barrier they took part in, through chains).
  std::vector<uint32_t> clocks;
  unsigned warps = 0;
  /// Whether an access by warp `v` at `time` happened before warp `w`'s
  /// current point.
  bool ordered(unsigned w, unsigned v, uint32_t time) const {
    return time < clocks[w * warps + v];
  }
  /// Completes barrier `id` for the threads waiting at it.
  void completeBarrier(uint32_t id);
  /// The warps waiting at `first`'s counted barrier, all their live lanes
  /// there; fails (nullopt) for a warp split across barriers.
  std::optional<unsigned> wholeWarpsAt(const Thread &first);
  struct UnwrittenRead {
    const Thread *thread = nullptr;
    const Function *fn = nullptr;
    uint32_t pc = 0;
    std::string where;
  } unwrittenRead;
  unsigned lastBuffer = 0;
  /// executed() when the block started, and taken branches left until the
  /// next runaway check.
  uint64_t blockStart = 0;
  uint32_t branchesUntilCheck = kRunawayCheckInterval;
};

BlockRunner::BlockRunner(const Context &context)
    : context(context), launch(context.launch) {
  threads.resize(context.threadCount);
  for (unsigned i = 0; i < context.threadCount; ++i) {
    Thread &thread = threads[i];
    thread.linear = i;
    thread.tid[0] = i % launch.block[0];
    thread.tid[1] = i / launch.block[0] % launch.block[1];
    thread.tid[2] = i / (launch.block[0] * launch.block[1]);
  }
  waitingLanes.resize((context.threadCount + 31) / 32);
  goneLanes.resize(waitingLanes.size());
  warps = waitingLanes.size();
  clocks.resize(warps * warps);
  shared.resize(context.sharedBytes);
  shadow.resize(context.sharedBytes);
  traffic.resize(context.ranges.size());
  if (launch.trafficDetail)
    for (const BufferRange &range : context.ranges) {
      uint64_t sectors = (range.end - 1) / 32 - range.begin / 32 + 1;
      traffic[range.index].blockStamps.assign(sectors, 0);
      traffic[range.index].launchBits.assign((sectors + 63) / 64, 0);
    }
}

void BlockRunner::makeFrame(Thread &thread, const Function &fn,
                            uint32_t base) {
  uint32_t words = context.frameWords.lookup(&fn);
  if (thread.stack.size() < base + words)
    thread.stack.resize(base + words);
  uint64_t *registers = thread.stack.data() + base;
  for (size_t i = 0; i < fn.constants.size(); ++i)
    registers[fn.constantSlots[i]] = fn.constants[i];
  const uint32_t values[] = {
      thread.tid[0],   thread.tid[1],   thread.tid[2],
      launch.block[0], launch.block[1], launch.block[2],
      ctaid[0],        ctaid[1],        ctaid[2],
      launch.grid[0],  launch.grid[1],  launch.grid[2],
      thread.linear % 32, thread.linear / 32};
  for (size_t i = 0; i < fn.specials.size(); ++i)
    if (fn.specials[i] != kNoSlot)
      registers[fn.specials[i]] = values[i];
  uint8_t *defined = reinterpret_cast<uint8_t *>(registers + fn.definedWord());
  std::fill_n(defined, fn.checkedRegisters, 0);
  // .param space and .local arrays start zeroed.
  std::fill(registers + fn.slots, registers + fn.definedWord(), 0);
}

std::string BlockRunner::describe(const Thread &thread, const Function &fn,
                                  uint32_t pc) const {
  const Function::Source &source = fn.sources[fn.code[pc].source];
  std::string function =
      &fn == &context.kernel
          ? "kernel " + fn.name
          : "device function " + fn.name + " called by kernel " +
                context.kernel.name;
  return llvm::formatv("{0}, block ({1}, {2}, {3}), thread ({4}, {5}, {6}), "
                       "PTX line {7}: `{8}`",
                       function, ctaid[0], ctaid[1], ctaid[2], thread.tid[0],
                       thread.tid[1], thread.tid[2], source.line, source.text)
      .str();
}

bool BlockRunner::fail(const Thread &thread, const Function &fn, uint32_t pc,
                       int code, const llvm::Twine &what) {
  error = LaunchError{code, what.str() + " in " + describe(thread, fn, pc)};
  return false;
}

/// Whether [address, address + bytes) lies in [begin, end); an access that
/// would wrap around the top of the address space lies in nothing.
inline bool within(uint64_t address, unsigned bytes, uint64_t begin,
                   uint64_t end) {
  return address >= begin && address <= end && bytes <= end - address;
}

bool BlockRunner::checkGlobal(const Thread &thread, const Function &fn,
                              uint32_t pc, uint64_t address, unsigned bytes,
                              bool store, bool constSpace) {
  const char *access = store ? "store" : "load";
  if (address % bytes != 0)
    return fail(thread, fn, pc, kMisalignedAddress,
                llvm::formatv("misaligned global {0} of {1} bytes at {2:x}",
                              access, bytes, address));
  const std::vector<BufferRange> &ranges = context.ranges;
  const BufferRange *range = nullptr;
  if (lastBuffer < ranges.size() &&
      within(address, bytes, ranges[lastBuffer].begin,
             ranges[lastBuffer].end)) {
    range = &ranges[lastBuffer];
  } else {
    // The innermost buffer that contains the access.
    auto after = std::upper_bound(
        ranges.begin(), ranges.end(), address,
        [](uint64_t value, const BufferRange &r) { return value < r.begin; });
    for (auto it = after; it != ranges.begin();) {
      --it;
      if (within(address, bytes, it->begin, it->end)) {
        range = &*it;
        break;
      }
    }
    if (!range) {
      std::string nearest;
      if (ranges.empty()) {
        nearest = "the launch was given no buffers";
      } else {
        const BufferRange *best = &ranges.front();
        // The access is aligned, so its last byte does not wrap around.
        uint64_t last = address + (bytes - 1);
        auto distance = [&](const BufferRange &r) {
          return address < r.begin ? r.begin - address
                 : last >= r.end   ? last - r.end + 1
                                   : 0;
        };
        for (const BufferRange &r : ranges)
          if (distance(r) < distance(*best))
            best = &r;
        const std::string &name = context.bufferNames[best->index];
        if (address >= best->end)
          nearest = llvm::formatv("{0} bytes past the end of buffer '{1}' "
                                  "({2} bytes at {3:x})",
                                  address - best->end, name,
                                  best->end - best->begin, best->begin);
        else if (last >= best->end)
          nearest = llvm::formatv("runs {0} bytes past the end of buffer "
                                  "'{1}' ({2} bytes at {3:x})",
                                  last - best->end + 1, name,
                                  best->end - best->begin, best->begin);
        else
          nearest = llvm::formatv("{0} bytes before buffer '{1}' ({2} bytes "
                                  "at {3:x})",
                                  best->begin - address, name,
                                  best->end - best->begin, best->begin);
      }
      return fail(thread, fn, pc, kIllegalAddress,
                  llvm::formatv("out-of-bounds global {0} of {1} bytes at "
                                "{2:x}: {3}",
                                access, bytes, address, nearest));
    }
    lastBuffer = range - ranges.data();
  }
  if (range->constant != constSpace)
    return fail(thread, fn, pc, kIllegalAddress,
                llvm::formatv("{0} {1} of {2} bytes at {3:x}: in {4} '{5}'",
                              constSpace ? "a .const" : "a global", access,
                              bytes, address,
                              range->constant ? ".const variable" : "buffer",
                              context.bufferNames[range->index]));
  Traffic &counter = traffic[range->index];
  if (store) {
    counter.storedBytes += bytes;
    ++counter.stores;
  } else {
    counter.loadedBytes += bytes;
    ++counter.loads;
  }
  if (launch.trafficDetail) {
    uint64_t first = address / 32 - range->begin / 32,
             last = (address + bytes - 1) / 32 - range->begin / 32;
    for (uint64_t sector = first; sector <= last; ++sector) {
      if (counter.blockStamps[sector] != blockIndex + 1) {
        counter.blockStamps[sector] = blockIndex + 1;
        counter.blockUnique += 32;
      }
      counter.launchBits[sector / 64] |= uint64_t(1) << (sector % 64);
    }
  }
  return true;
}

bool BlockRunner::checkShared(const Thread &thread, const Function &fn,
                              uint32_t pc, uint64_t address, unsigned bytes,
                              bool store) {
  const char *access = store ? "store" : "load";
  const SharedArray *array = nullptr;
  for (const SharedArray &candidate : context.kernel.shared) {
    uint64_t size = candidate.dynamic ? launch.dynamicSharedBytes
                                      : candidate.bytes;
    if (within(address, bytes, candidate.offset, candidate.offset + size))
      array = &candidate;
  }
  if (!array) {
    std::string arrays;
    for (const SharedArray &candidate : context.kernel.shared)
      arrays += llvm::formatv("{0}'{1}' [{2}, {3})", arrays.empty() ? "" : ", ",
                              candidate.name, candidate.offset,
                              candidate.offset +
                                  (candidate.dynamic ? launch.dynamicSharedBytes
                                                     : candidate.bytes));
    return fail(thread, fn, pc, kIllegalAddress,
                llvm::formatv("out-of-bounds shared {0} of {1} bytes at shared "
                              "address {2}: outside every .shared array ({3})",
                              access, bytes, address,
                              arrays.empty() ? "none declared" : arrays));
  }
  if (address % bytes != 0)
    return fail(thread, fn, pc, kMisalignedAddress,
                llvm::formatv("misaligned shared {0} of {1} bytes at shared "
                              "address {2}",
                              access, bytes, address));
  uint16_t me = thread.linear;
  unsigned line = fn.sources[fn.code[pc].source].line;
  auto name = [&](uint16_t other) -> std::string {
    if (other == kManyThreads)
      return "several other threads";
    const Thread &t = threads[other];
    return llvm::formatv("thread ({0}, {1}, {2})", t.tid[0], t.tid[1],
                         t.tid[2]);
  };
  unsigned warp = me / 32;
  for (uint64_t byte = address; byte < address + bytes; ++byte) {
    Shadow &cell = shadow[byte];
    auto where = [&] {
      return llvm::formatv("byte {0} of '{1}'", byte - array->offset,
                           array->name)
          .str();
    };
    // Accesses of earlier blocks are not this block's.
    bool written = cell.writeTime >= blockTime;
    if (cell.readTime < blockTime)
      cell.readWarps = 0;
    if (written && cell.writer != me &&
        !ordered(warp, cell.writer / 32, cell.writeTime))
      return fail(thread, fn, pc, kLaunchFailed,
                  llvm::formatv("shared-memory race on {0}: {1} wrote it at "
                                "PTX line {2} with no barrier between, and "
                                "this thread {3} it",
                                where(), name(cell.writer), cell.writeLine,
                                store ? "writes" : "reads"));
    if (store) {
      // Every read since the last write must precede this one (the reads'
      // latest time stands for each reading warp's: conservative).
      if (cell.readWarps && cell.reader != me)
        for (uint32_t readers = cell.readWarps; readers; readers &= readers - 1)
          if (!ordered(warp, llvm::countr_zero(readers), cell.readTime))
            return fail(thread, fn, pc, kLaunchFailed,
                        llvm::formatv("shared-memory race on {0}: {1} read it "
                                      "at PTX line {2} with no barrier "
                                      "between, and this thread writes it",
                                      where(), name(cell.reader),
                                      cell.readLine));
      cell.writeTime = now;
      cell.writer = me;
      cell.writeLine = line;
      cell.readWarps = 0;
    } else {
      // Reported at the next barrier unless another thread writes the
      // byte before it (then it is a race).
      if (!written && !unwrittenRead.thread)
        unwrittenRead = {&thread, &fn, pc, where()};
      // Reads this thread's warp has seen complete need no keeping: a write
      // ordered after this read is ordered after them (clocks join).
      bool earlierReadsSeen = true;
      for (uint32_t readers = cell.readWarps; readers; readers &= readers - 1)
        earlierReadsSeen &=
            ordered(warp, llvm::countr_zero(readers), cell.readTime);
      if (earlierReadsSeen)
        cell.readWarps = 0;
      if (!cell.readWarps)
        cell.reader = me;
      else if (cell.reader != me)
        cell.reader = kManyThreads;
      cell.readWarps |= uint32_t(1) << warp;
      cell.readTime = now;
      cell.readLine = line;
    }
  }
  return true;
}

template <typename T> inline T loadAs(const uint8_t *address) {
  T value;
  std::memcpy(&value, address, sizeof(T));
  return value;
}

/// One element of `size` bytes, extended as `signExtend` says.
inline uint64_t loadElement(const uint8_t *address, unsigned size,
                            bool signExtend) {
  switch (size) {
  case 1:
    return signExtend ? extend(loadAs<int8_t>(address))
                      : extend(loadAs<uint8_t>(address));
  case 2:
    return signExtend ? extend(loadAs<int16_t>(address))
                      : extend(loadAs<uint16_t>(address));
  case 4:
    return signExtend ? extend(loadAs<int32_t>(address))
                      : extend(loadAs<uint32_t>(address));
  default:
    return loadAs<uint64_t>(address);
  }
}

inline void loadInto(uint64_t *registers, const Instr &in,
                     const uint8_t *address) {
  bool signExtend = in.flags & kSignExtend;
  for (unsigned i = 0; i < in.count; ++i)
    if (in.r[i] != kNoSlot)
      registers[in.r[i]] = loadElement(address + i * in.size, in.size,
                                       signExtend);
}

inline void storeFrom(const uint64_t *registers, const Instr &in,
                      uint8_t *address) {
  for (unsigned i = 0; i < in.count; ++i)
    std::memcpy(address + i * in.size, &registers[in.r[i]], in.size);
}

template <bool Detail> Stop BlockRunner::execute(Thread &thread) {
  const Function *fn = thread.frames.back().fn;
  const Instr *code = fn->code.data();
  uint64_t *R = thread.stack.data() + thread.frames.back().base;
  uint32_t pc = thread.pc;
  uint64_t *count = counts;
  auto failAt = [&](int code, const llvm::Twine &what) {
    fail(thread, *fn, pc - 1, code, what);
    return Stop::Error;
  };
  auto paramSpace = [&] {
    return reinterpret_cast<uint8_t *>(R + fn->slots);
  };

  for (;;) {
    const Instr &in = code[pc++];
    ++count[static_cast<unsigned>(in.kind)];
    if (in.guardSense && (R[in.guard] != 0) != (in.guardSense == 1))
      continue;
    const uint32_t *r = in.r;
    if constexpr (Detail) {
      // ptxas schedules independent loads early, so a thread waits for
      // its loads only where they must complete: a load whose address or
      // a store whose data comes from one (the next loads cannot pass an
      // aliasing store), and control flow.
      bool boundary = in.op == Op::Bra;
      if ((in.op == Op::LdGlobal || in.op == Op::StGlobal) &&
          !thread.pendingLoads.empty())
        for (unsigned i = 0; i < 6 && !boundary; ++i)
          boundary = (in.sources >> i & 1) &&
                     llvm::is_contained(thread.pendingLoads, r[i]);
      if (boundary)
        endRoundTrip(thread);
    }
    switch (in.op) {
    // Moves.
    case Op::Mov: R[r[0]] = R[r[1]]; break;
    case Op::Selp: R[r[0]] = R[r[3]] ? R[r[1]] : R[r[2]]; break;
    case Op::NotPred: R[r[0]] = R[r[1]] == 0; break;
    case Op::Pack: {
      uint64_t mask = in.size == 64 ? ~0ull : (uint64_t(1) << in.size) - 1;
      uint64_t value = 0;
      for (unsigned i = 0; i < in.count; ++i)
        value |= (R[r[i]] & mask) << (i * in.size);
      R[r[4]] = value;
      break;
    }
    case Op::Unpack: {
      uint64_t mask = (uint64_t(1) << in.size) - 1, value = R[r[4]];
      for (unsigned i = 0; i < in.count; ++i)
        if (r[i] != kNoSlot)
          R[r[i]] = (value >> (i * in.size)) & mask;
      break;
    }

    // Memory.
    case Op::LdGlobal: {
      uint64_t address = R[r[4]] + in.imm;
      if (!checkGlobal(thread, *fn, pc - 1, address, in.size * in.count,
                       false, in.flags & kConstSpace))
        return Stop::Error;
      loadInto(R, in, reinterpret_cast<const uint8_t *>(address));
      if constexpr (Detail)
        for (unsigned i = 0; i < in.count; ++i)
          if (r[i] != kNoSlot)
            thread.pendingLoads.push_back(r[i]);
      break;
    }
    case Op::StGlobal: {
      uint64_t address = R[r[4]] + in.imm;
      if (!checkGlobal(thread, *fn, pc - 1, address, in.size * in.count, true,
                       false))
        return Stop::Error;
      storeFrom(R, in, reinterpret_cast<uint8_t *>(address));
      break;
    }
    case Op::LdShared:
    case Op::StShared: {
      uint64_t base = in.flags & kAddress32 ? static_cast<uint32_t>(R[r[4]])
                                            : R[r[4]];
      uint64_t address = base + in.imm;
      bool store = in.op == Op::StShared;
      if (!checkShared(thread, *fn, pc - 1, address, in.size * in.count, store))
        return Stop::Error;
      if (store)
        storeFrom(R, in, shared.data() + address);
      else
        loadInto(R, in, shared.data() + address);
      break;
    }
    case Op::LdKernelParam:
      loadInto(R, in, launch.params.data() + in.imm);
      break;
    case Op::LdKernelParamAt: {
      // The parameter the address was taken of, and the offset within it.
      uint64_t address = R[r[4]] + in.imm;
      unsigned bytes = in.size * in.count;
      uint64_t index = (address - kKernelParamSpace) >> 32;
      uint64_t within = address & 0xffff'ffffull;
      const std::vector<KernelParam> &params = context.kernel.params;
      if (address < kKernelParamSpace || index >= params.size() ||
          within + bytes > params[index].bytes) {
        fail(thread, *fn, pc - 1, kIllegalAddress,
             index < params.size() && address >= kKernelParamSpace
                 ? llvm::formatv("ld.param of {0} bytes at offset {1} is "
                                 "outside .param {2} ({3} bytes)",
                                 bytes, within, params[index].name,
                                 params[index].bytes)
                       .str()
                 : llvm::formatv("ld.param of {0} bytes at {1:x}: not a "
                                 "kernel parameter's address",
                                 bytes, address)
                       .str());
        return Stop::Error;
      }
      if (within % bytes != 0) {
        fail(thread, *fn, pc - 1, kMisalignedAddress,
             llvm::formatv("misaligned ld.param of {0} bytes at offset {1} "
                           "of .param {2}",
                           bytes, within, params[index].name));
        return Stop::Error;
      }
      loadInto(R, in, launch.params.data() + params[index].offset + within);
      break;
    }
    case Op::LdFrameParam: loadInto(R, in, paramSpace() + in.imm); break;
    case Op::StFrameParam: storeFrom(R, in, paramSpace() + in.imm); break;
    case Op::LdLocal:
    case Op::StLocal: {
      // A local address is an offset in this frame's .local arrays.
      uint64_t address = R[r[4]] + in.imm;
      unsigned bytes = in.size * in.count;
      bool store = in.op == Op::StLocal;
      if (!within(address, bytes, 0, fn->localBytes))
        return failAt(kIllegalAddress,
                      llvm::formatv("out-of-bounds local {0} of {1} bytes at "
                                    "local address {2}: the function's .local "
                                    "arrays take {3} bytes",
                                    store ? "store" : "load", bytes,
                                    int64_t(address), fn->localBytes));
      if (address % bytes != 0)
        return failAt(kMisalignedAddress,
                      llvm::formatv("misaligned local {0} of {1} bytes at "
                                    "local address {2}",
                                    store ? "store" : "load", bytes, address));
      uint8_t *local = reinterpret_cast<uint8_t *>(R + fn->localWord());
      if (store)
        storeFrom(R, in, local + address);
      else
        loadInto(R, in, local + address);
      break;
    }

    // Carry arithmetic and funnel shifts.
    case Op::Carry: {
      unsigned bits = in.size;
      uint64_t mask = bits == 64 ? ~uint64_t(0) : 0xFFFFFFFFu;
      bool isSigned = in.flags & kSigned;
      auto operand = [&](unsigned i) -> unsigned __int128 {
        return R[r[i]] & mask;
      };
      unsigned __int128 carryIn = in.flags & kCarryIn ? R[r[4]] & 1 : 0;
      unsigned __int128 a = operand(1), b = operand(2), result = 0;
      bool carryOut = false;
      switch (static_cast<CarryKind>(in.compare)) {
      case CarryKind::Add:
        result = a + b + carryIn;
        carryOut = (result >> bits) & 1;
        break;
      case CarryKind::Sub: // the flag is a borrow
        result = a - b - carryIn;
        carryOut = a < b + carryIn;
        break;
      case CarryKind::MadLo:
      case CarryKind::MadHi: {
        auto signedValue = [&](unsigned __int128 value) -> __int128 {
          return bits == 64 ? __int128(int64_t(value))
                            : __int128(int32_t(uint32_t(value)));
        };
        unsigned __int128 product =
            isSigned ? static_cast<unsigned __int128>(signedValue(a) *
                                                      signedValue(b))
                     : a * b;
        unsigned __int128 part =
            (in.compare == uint8_t(CarryKind::MadLo) ? product
                                                     : product >> bits) &
            mask;
        result = part + operand(3) + carryIn;
        carryOut = (result >> bits) & 1;
        break;
      }
      }
      uint64_t value = uint64_t(result) & mask;
      R[r[0]] = isSigned && bits == 32 ? extend(int32_t(uint32_t(value)))
                                       : value;
      if (in.flags & kCarryOut)
        R[r[4]] = carryOut;
      break;
    }
    case Op::Funnel: {
      uint32_t amount = static_cast<uint32_t>(R[r[3]]);
      amount = in.flags & kWrap ? amount & 31 : std::min(amount, 32u);
      uint64_t pair = uint64_t(static_cast<uint32_t>(R[r[2]])) << 32 |
                      static_cast<uint32_t>(R[r[1]]);
      R[r[0]] = static_cast<uint32_t>(in.compare ? (pair << amount) >> 32
                                                 : pair >> amount);
      break;
    }
    case Op::Permute: {
      // Bytes 0-3 of a, 4-7 of b; each selector nibble picks one, its bit
      // 3 replicating that byte's sign instead.
      uint64_t bytes = uint64_t(static_cast<uint32_t>(R[r[2]])) << 32 |
                       static_cast<uint32_t>(R[r[1]]);
      uint32_t selectors = static_cast<uint32_t>(R[r[3]]), result = 0;
      for (unsigned i = 0; i < 4; ++i) {
        unsigned selector = (selectors >> (4 * i)) & 0xF;
        uint32_t byte = (bytes >> (8 * (selector & 7))) & 0xFF;
        if (selector & 8)
          byte = byte & 0x80 ? 0xFF : 0;
        result |= byte << (8 * i);
      }
      R[r[0]] = result;
      break;
    }

    // Integer ops, one case per type.
#define TILEFUSE_INT_CASE(OP, TYPE, CTYPE, ...)                                \
  case Op::OP##TYPE: {                                                         \
    using T = CTYPE;                                                           \
    __VA_ARGS__;                                                               \
    break;                                                                     \
  }
#define TILEFUSE_INT_CASES(OP, ...)                                            \
  TILEFUSE_INT_CASE(OP, U16, uint16_t, __VA_ARGS__)                            \
  TILEFUSE_INT_CASE(OP, S16, int16_t, __VA_ARGS__)                             \
  TILEFUSE_INT_CASE(OP, U32, uint32_t, __VA_ARGS__)                            \
  TILEFUSE_INT_CASE(OP, S32, int32_t, __VA_ARGS__)                             \
  TILEFUSE_INT_CASE(OP, U64, uint64_t, __VA_ARGS__)                            \
  TILEFUSE_INT_CASE(OP, S64, int64_t, __VA_ARGS__)
#define A as<T>(R[r[1]])
#define B as<T>(R[r[2]])
#define C as<T>(R[r[3]])
      TILEFUSE_INT_CASES(Add, R[r[0]] = extend(add<T>(A, B)))
      TILEFUSE_INT_CASES(Sub, R[r[0]] = extend(sub<T>(A, B)))
      TILEFUSE_INT_CASES(MulLo, R[r[0]] = extend(mulLo<T>(A, B)))
      TILEFUSE_INT_CASES(MulHi, R[r[0]] = extend(mulHi<T>(A, B)))
      TILEFUSE_INT_CASES(MulWide, R[r[0]] = extend(mulWide<T>(A, B)))
      TILEFUSE_INT_CASES(MadLo, R[r[0]] = extend(add<T>(mulLo<T>(A, B), C)))
      TILEFUSE_INT_CASES(MadHi, R[r[0]] = extend(add<T>(mulHi<T>(A, B), C)))
      TILEFUSE_INT_CASES(MadWide, using W = WideOf<T>;
                         R[r[0]] = extend(add<W>(mulWide<T>(A, B),
                                                 as<W>(R[r[3]]))))
      TILEFUSE_INT_CASES(Min, R[r[0]] = extend(std::min<T>(A, B)))
      TILEFUSE_INT_CASES(Max, R[r[0]] = extend(std::max<T>(A, B)))
      TILEFUSE_INT_CASES(
          Div, T b = B; if (b == 0) return failAt(kLaunchFailed,
                                                  "integer division by zero");
          T a = A;
          R[r[0]] = extend(std::is_signed_v<T> && b == T(-1) ? negate(a)
                                                             : T(a / b)))
      TILEFUSE_INT_CASES(
          Rem, T b = B; if (b == 0) return failAt(kLaunchFailed,
                                                  "integer remainder by zero");
          T a = A;
          R[r[0]] = extend(std::is_signed_v<T> && b == T(-1) ? T(0)
                                                             : T(a % b)))
      TILEFUSE_INT_CASES(And, R[r[0]] = extend(T(A & B)))
      TILEFUSE_INT_CASES(Or, R[r[0]] = extend(T(A | B)))
      TILEFUSE_INT_CASES(Xor, R[r[0]] = extend(T(A ^ B)))
      TILEFUSE_INT_CASES(Not, R[r[0]] = extend(T(~A)))
      TILEFUSE_INT_CASES(Shl, R[r[0]] = extend(shl<T>(
                                  A, static_cast<uint32_t>(R[r[2]]))))
      TILEFUSE_INT_CASES(Shr, R[r[0]] = extend(shr<T>(
                                  A, static_cast<uint32_t>(R[r[2]]))))
      TILEFUSE_INT_CASES(Neg, R[r[0]] = extend(negate<T>(A)))
      TILEFUSE_INT_CASES(Abs, R[r[0]] = extend(absolute<T>(A)))
      TILEFUSE_INT_CASES(Popc, R[r[0]] = popc<T>(A))
      TILEFUSE_INT_CASES(Clz, R[r[0]] = clz<T>(A))
      TILEFUSE_INT_CASES(Bfe, R[r[0]] = extend(bitfield<T>(
                                  A, static_cast<uint32_t>(R[r[2]]),
                                  static_cast<uint32_t>(R[r[3]]))))
      TILEFUSE_INT_CASES(SetpInt, R[r[0]] = compareInt<T>(
                                      static_cast<Compare>(in.compare), A, B))
#undef A
#undef B
#undef C
#undef TILEFUSE_INT_CASES
#undef TILEFUSE_INT_CASE

    // f32.
#define F(i) toFloat(R[r[i]])
    case Op::AddF32: R[r[0]] = fromFloat(F(1) + F(2)); break;
    case Op::SubF32: R[r[0]] = fromFloat(F(1) - F(2)); break;
    case Op::MulF32: R[r[0]] = fromFloat(F(1) * F(2)); break;
    case Op::FmaF32: R[r[0]] = fromFloat(std::fma(F(1), F(2), F(3))); break;
    case Op::NegF32: R[r[0]] = R[r[1]] ^ 0x80000000u; break;
    case Op::AbsF32: R[r[0]] = R[r[1]] & 0x7FFFFFFFu; break;
    case Op::MinF32:
    case Op::MinNaNF32:
      R[r[0]] = fromFloat(minOf(F(1), F(2), in.op == Op::MinNaNF32,
                                toFloat(kCanonicalNaN32)));
      break;
    case Op::MaxF32:
    case Op::MaxNaNF32:
      R[r[0]] = fromFloat(maxOf(F(1), F(2), in.op == Op::MaxNaNF32,
                                toFloat(kCanonicalNaN32)));
      break;
    case Op::DivF32: R[r[0]] = fromFloat(F(1) / F(2)); break;
    case Op::CopysignF32:
      R[r[0]] = (R[r[2]] & 0x7FFFFFFFu) | (R[r[1]] & 0x80000000u);
      break;
    case Op::SetpF32: {
      float a = F(1), b = F(2);
      if (in.flags & kSubnormalFlush) {
        a = flushSubnormal(a);
        b = flushSubnormal(b);
      }
      R[r[0]] = compare(static_cast<Compare>(in.compare), a, b);
      break;
    }
    case Op::Ex2F32:
      R[r[0]] = fromFloat(approximated(std::exp2(double(F(1))), FloatKind::Ex2));
      break;
    case Op::Ex2FtzF32:
      R[r[0]] = fromFloat(flushSubnormal(approximated(
          std::exp2(double(flushSubnormal(F(1)))), FloatKind::Ex2)));
      break;
    case Op::RsqrtF32:
      R[r[0]] = fromFloat(
          approximated(1.0 / std::sqrt(double(F(1))), FloatKind::Rsqrt));
      break;
    case Op::SqrtApproxF32:
      R[r[0]] = fromFloat(approximated(std::sqrt(double(F(1))), FloatKind::Sqrt));
      break;
    case Op::SqrtF32: R[r[0]] = fromFloat(std::sqrt(F(1))); break;
    case Op::RcpF32: R[r[0]] = fromFloat(1.0f / F(1)); break;
    case Op::RcpApproxFtzF32:
      R[r[0]] = fromFloat(flushSubnormal(
          approximated(1.0 / double(flushSubnormal(F(1))), FloatKind::Rcp)));
      break;
#undef F

    // f64.
#define D(i) toDouble(R[r[i]])
    case Op::AddF64: R[r[0]] = fromDouble(D(1) + D(2)); break;
    case Op::SubF64: R[r[0]] = fromDouble(D(1) - D(2)); break;
    case Op::MulF64: R[r[0]] = fromDouble(D(1) * D(2)); break;
    case Op::FmaF64: R[r[0]] = fromDouble(std::fma(D(1), D(2), D(3))); break;
    case Op::NegF64: R[r[0]] = R[r[1]] ^ (uint64_t(1) << 63); break;
    case Op::AbsF64: R[r[0]] = R[r[1]] & ~(uint64_t(1) << 63); break;
    case Op::MinF64:
      R[r[0]] = fromDouble(minOf(D(1), D(2), false, std::nan("")));
      break;
    case Op::MaxF64:
      R[r[0]] = fromDouble(maxOf(D(1), D(2), false, std::nan("")));
      break;
    case Op::DivF64: R[r[0]] = fromDouble(D(1) / D(2)); break;
    case Op::CopysignF64:
      R[r[0]] = (R[r[2]] & ~(uint64_t(1) << 63)) |
                (R[r[1]] & (uint64_t(1) << 63));
      break;
    case Op::SetpF64:
      R[r[0]] = compare(static_cast<Compare>(in.compare), D(1), D(2));
      break;
    case Op::SqrtF64: R[r[0]] = fromDouble(std::sqrt(D(1))); break;
    case Op::RcpF64: R[r[0]] = fromDouble(1.0 / D(1)); break;
    case Op::RsqrtApproxF64: R[r[0]] = fromDouble(1.0 / std::sqrt(D(1))); break;
    case Op::RcpApproxFtzF64: {
      // PTX: the reciprocal of the upper 32 bits of a (1.11.20 format),
      // subnormals flushed, in the upper 32 bits of d.
      double a = toDouble(R[r[1]] & 0xFFFFFFFF00000000ull);
      if (std::fpclassify(a) == FP_SUBNORMAL)
        a = std::copysign(0.0, a);
      double reciprocal = 1.0 / a;
      R[r[0]] = std::isnan(reciprocal)
                    ? 0x7FFFFFFF00000000ull
                    : fromDouble(reciprocal) & 0xFFFFFFFF00000000ull;
      break;
    }
#undef D

    // Everything else in floating point.
    case Op::FloatGeneric: {
      const FloatForm &form = fn->floatForms[in.imm];
      auto operand = [&](unsigned i) { // unary and binary forms lack some
        return r[i] == kNoSlot ? 0 : R[r[i]];
      };
      if (form.lanes == 1) {
        R[r[0]] = evaluate(form, operand(1), operand(2), operand(3),
                           launch.approximation);
        break;
      }
      uint64_t result = 0;
      for (unsigned lane = 0; lane < 2; ++lane) {
        auto half = [&](unsigned i) {
          return (operand(i) >> (16 * lane)) & 0xFFFF;
        };
        result |= evaluate(form, half(1), half(2), half(3),
                           launch.approximation)
                  << (16 * lane);
      }
      R[r[0]] = result;
      break;
    }
    case Op::SetpHalf: {
      FloatFormat format = in.size ? FloatFormat::BF16 : FloatFormat::F16;
      R[r[0]] = compare(static_cast<Compare>(in.compare),
                        halfToDouble(R[r[1]] & 0xFFFF, format),
                        halfToDouble(R[r[2]] & 0xFFFF, format));
      break;
    }

    // Conversions.
    case Op::CvtF32F16:
      R[r[0]] = fromFloat(f16ToFloat(R[r[1]] & 0xFFFF));
      break;
    case Op::CvtF32BF16:
      R[r[0]] = fromFloat(bf16ToFloat(R[r[1]] & 0xFFFF));
      break;
    case Op::CvtF16F32: R[r[0]] = floatToF16(toFloat(R[r[1]])); break;
    case Op::CvtBF16F32: R[r[0]] = floatToBF16(toFloat(R[r[1]])); break;
    case Op::CvtF16x2F32:
      R[r[0]] = (uint64_t(floatToF16(toFloat(R[r[1]]))) << 16) |
                floatToF16(toFloat(R[r[2]]));
      break;
    case Op::CvtBF16x2F32:
      R[r[0]] = (uint64_t(floatToBF16(toFloat(R[r[1]]))) << 16) |
                floatToBF16(toFloat(R[r[2]]));
      break;
    case Op::CvtGeneric:
      R[r[0]] = convert(fn->conversionForms[in.imm], R[r[1]]);
      break;

    // Control.
    case Op::Bra:
      if (--branchesUntilCheck == 0) {
        branchesUntilCheck = kRunawayCheckInterval;
        if (executed() - blockStart > launch.blockInstructionBudget)
          return failAt(kLaunchFailed,
                        llvm::formatv("runaway block: it ran {0} "
                                      "thread-instructions without "
                                      "completing (a loop without end, or a "
                                      "block too large to emulate)",
                                      launch.blockInstructionBudget));
      }
      pc = static_cast<uint32_t>(in.imm);
      break;
    case Op::Call: {
      if constexpr (Detail)
        endRoundTrip(thread);
      if (thread.frames.size() >= kMaxCallDepth)
        return failAt(kLaunchFailed,
                      llvm::formatv("calls nested deeper than {0}",
                                    kMaxCallDepth));
      const CallSite &site = fn->calls[in.imm];
      const Function &callee = *context.module.functions[site.callee];
      uint32_t base = thread.frames.back().base + context.frameWords.lookup(fn);
      if ((uint64_t(base) + context.frameWords.lookup(&callee)) * 8 >
          kMaxStackBytes)
        return failAt(kLaunchFailed,
                      llvm::formatv("the frames of nested calls exceed {0} "
                                    "KiB per thread",
                                    kMaxStackBytes / 1024));
      makeFrame(thread, callee, base);
      uint64_t *caller = thread.stack.data() + thread.frames.back().base;
      uint8_t *from = reinterpret_cast<uint8_t *>(caller + fn->slots);
      uint8_t *to = reinterpret_cast<uint8_t *>(thread.stack.data() + base +
                                                callee.slots);
      for (const CallSite::Copy &copy : site.arguments)
        std::memcpy(to + copy.to, from + copy.from, copy.bytes);
      thread.frames.push_back({&callee, base, pc, &site});
      fn = &callee;
      code = fn->code.data();
      R = thread.stack.data() + base;
      pc = 0;
      break;
    }
    case Op::Ret: {
      if constexpr (Detail)
        endRoundTrip(thread);
      if (thread.frames.size() == 1) {
        thread.pc = pc;
        return Stop::Exit;
      }
      Frame done = thread.frames.pop_back_val();
      const Frame &caller = thread.frames.back();
      uint8_t *from = reinterpret_cast<uint8_t *>(R + fn->slots);
      uint64_t *callerRegisters = thread.stack.data() + caller.base;
      uint8_t *to = reinterpret_cast<uint8_t *>(callerRegisters +
                                                caller.fn->slots);
      for (const CallSite::Copy &copy : done.call->results)
        std::memcpy(to + copy.to, from + copy.from, copy.bytes);
      fn = caller.fn;
      code = fn->code.data();
      R = callerRegisters;
      pc = done.returnPc;
      break;
    }
    case Op::Bar: {
      if constexpr (Detail)
        endRoundTrip(thread);
      uint32_t id = static_cast<uint32_t>(R[r[0]]);
      uint32_t count = r[1] == kNoSlot ? 0 : static_cast<uint32_t>(R[r[1]]);
      if (id > 15)
        return failAt(kLaunchFailed,
                      llvm::formatv("bar.sync on barrier {0}: a block has "
                                    "barriers 0-15",
                                    id));
      if (r[1] != kNoSlot &&
          (count == 0 || count % 32 != 0 || count > threads.size()))
        return failAt(kLaunchFailed,
                      llvm::formatv("bar.sync with {0} threads: a multiple "
                                    "of 32 from 32 to the block's {1} is "
                                    "expected",
                                    count, threads.size()));
      thread.barrierId = id;
      thread.barrierCount = count;
      thread.pc = pc;
      thread.waitPc = pc - 1;
      return Stop::Barrier;
    }
    case Op::Shfl:
      if constexpr (Detail)
        endRoundTrip(thread);
      thread.pc = pc;
      thread.waitPc = pc - 1;
      thread.shuffleValue = static_cast<uint32_t>(R[r[2]]);
      thread.shuffleB = static_cast<uint32_t>(R[r[3]]);
      thread.shuffleC = static_cast<uint32_t>(R[r[4]]);
      thread.shuffleMask = static_cast<uint32_t>(R[r[5]]);
      thread.shuffleMode = in.compare;
      return Stop::Shuffle;

    // Inserted checks.
    case Op::CheckDefined: {
      const uint8_t *defined =
          reinterpret_cast<const uint8_t *>(R + fn->definedWord());
      if (!defined[in.imm])
        return failAt(kLaunchFailed,
                      llvm::formatv("read of uninitialized register {0}: this "
                                    "thread never wrote it",
                                    fn->checkedNames[in.imm]));
      break;
    }
    case Op::MarkDefined: {
      uint8_t *defined = reinterpret_cast<uint8_t *>(R + fn->definedWord());
      defined[in.imm] = 1;
      break;
    }
    case Op::Count:
      return failAt(kLaunchFailed, "internal error: bad op");
    }
  }
}

/// A thread arrived at shfl.sync: completes the shuffle when every lane of
/// its member mask that has not exited waits at one (PTX: shfl.sync waits
/// for the non-exited threads of membermask; the lanes past the end of a
/// partial warp count as exited). Reading the value of an exited lane, or
/// of a lane outside the mask, is an error: PTX leaves it undefined.
bool BlockRunner::arriveAtShuffle(Thread &thread) {
  const Function &fn = *thread.frames.back().fn;
  uint32_t mask = thread.shuffleMask;
  unsigned lane = thread.linear % 32, warpBase = thread.linear - lane;
  if (!(mask >> lane & 1))
    return fail(thread, fn, thread.waitPc, kLaunchFailed,
                llvm::formatv("shfl.sync by a lane not in its membermask "
                              "{0:x8}",
                              mask));
  unsigned warp = thread.linear / 32;
  uint32_t members = mask & ~goneLanes[warp];
  if (members & ~waitingLanes[warp])
    return true; // not complete yet
  // Every live lane is here: the same mask and mode, then exchange.
  uint32_t values[32];
  for (unsigned l = 0; l < 32; ++l) {
    if (!(members >> l & 1))
      continue;
    const Thread &other = threads[warpBase + l];
    if (other.shuffleMask != mask || other.shuffleMode != thread.shuffleMode)
      return fail(thread, fn, thread.waitPc, kLaunchFailed,
                  llvm::formatv("lanes {0} and {1} meet at shfl.sync with "
                                "different membermasks or modes (line {2})",
                                lane, l,
                                other.frames.back()
                                    .fn->sources[other.frames.back()
                                                     .fn->code[other.waitPc]
                                                     .source]
                                    .line));
    values[l] = other.shuffleValue;
  }
  for (unsigned l = 0; l < 32; ++l) {
    if (!(members >> l & 1))
      continue;
    Thread &other = threads[warpBase + l];
    uint32_t b = other.shuffleB & 31, c = other.shuffleC & 31,
             segment = (other.shuffleC >> 8) & 31;
    int maxLane = (l & segment) | (c & ~segment), minLane = l & segment;
    int source = l;
    bool inRange = false;
    switch (other.shuffleMode) {
    case 0: source = int(l) - int(b); inRange = source >= maxLane; break;
    case 1: source = int(l) + int(b); inRange = source <= maxLane; break;
    case 2: source = int(l ^ b); inRange = source <= maxLane; break;
    default:
      source = minLane | (b & ~segment);
      inRange = source <= maxLane;
      break;
    }
    if (!inRange)
      source = l;
    const Function &otherFn = *other.frames.back().fn;
    if (!(mask >> source & 1))
      return fail(other, otherFn, other.waitPc, kLaunchFailed,
                  llvm::formatv("shfl.sync reads lane {0}, which is not in "
                                "membermask {1:x8}",
                                source, mask));
    if (!(members >> source & 1))
      return fail(other, otherFn, other.waitPc, kLaunchFailed,
                  llvm::formatv("shfl.sync reads lane {0}, which {1}", source,
                                warpBase + source < threads.size()
                                    ? "has exited"
                                    : llvm::formatv("does not exist in a "
                                                    "block of {0} threads",
                                                    threads.size())
                                          .str()));
    const Instr &instr = otherFn.code[other.waitPc];
    uint64_t *registers = other.stack.data() + other.frames.back().base;
    if (instr.r[0] != kNoSlot)
      registers[instr.r[0]] = values[source];
    if (instr.r[1] != kNoSlot)
      registers[instr.r[1]] = inRange;
    makeReady(other);
  }
  ++shuffles;
  return true;
}

bool BlockRunner::completeShufflesAfterExit(const Thread &exited) {
  unsigned warp = exited.linear / 32;
  for (uint32_t pending = waitingLanes[warp]; pending; pending &= pending - 1) {
    unsigned lane = llvm::countr_zero(pending);
    // Lanes of a group an earlier lane completed are no longer waiting.
    if (waitingLanes[warp] >> lane & 1 &&
        !arriveAtShuffle(threads[warp * 32 + lane]))
      return false;
  }
  return true;
}

/// No thread can run: completes the barriers whose threads all wait at
/// them, or explains why the block can never complete.
bool BlockRunner::resolveStalled() {
  const Thread *atBarrier = nullptr, *atShuffle = nullptr, *exited = nullptr;
  for (const Thread &thread : threads) {
    if (thread.state == Thread::State::Barrier && !atBarrier)
      atBarrier = &thread;
    if (thread.state == Thread::State::Shuffle && !atShuffle)
      atShuffle = &thread;
    if (thread.state == Thread::State::Exited && !exited)
      exited = &thread;
  }
  auto lineOf = [](const Thread &thread) {
    const Function &fn = *thread.frames.back().fn;
    return fn.sources[fn.code[thread.waitPc].source].line;
  };
  auto nameOf = [](const Thread &thread) {
    return llvm::formatv("thread ({0}, {1}, {2})", thread.tid[0],
                         thread.tid[1], thread.tid[2])
        .str();
  };
  if (atShuffle) {
    // Its group lacks a lane that waits elsewhere.
    const Thread &waiting = *atShuffle;
    unsigned warpBase = waiting.linear - waiting.linear % 32;
    std::string missing = "a lane that is not waiting at a shuffle";
    for (unsigned l = 0; l < 32; ++l) {
      if (!(waiting.shuffleMask >> l & 1) || warpBase + l >= threads.size())
        continue;
      const Thread &other = threads[warpBase + l];
      if (other.state == Thread::State::Barrier) {
        missing = llvm::formatv("lane {0}, which waits at bar.sync (PTX line "
                                "{1})",
                                l, lineOf(other));
        break;
      }
    }
    return fail(waiting, *waiting.frames.back().fn, waiting.waitPc,
                kLaunchFailed,
                llvm::formatv("deadlock: shfl.sync (membermask {0:x8}) can "
                              "never complete: it waits for {1}",
                              waiting.shuffleMask, missing));
  }
  if (!checkUnwrittenReads())
    return false;
  if (!atBarrier)
    return true; // every thread exited: the block is done
  // The threads at each barrier number; the first of them.
  unsigned arrived[16] = {};
  const Thread *firstAt[16] = {};
  for (const Thread &thread : threads)
    if (thread.state == Thread::State::Barrier) {
      ++arrived[thread.barrierId];
      if (!firstAt[thread.barrierId])
        firstAt[thread.barrierId] = &thread;
    }
  bool completed = false;
  for (uint32_t id = 0; id < 16; ++id) {
    if (!firstAt[id])
      continue;
    const Thread &first = *firstAt[id];
    const Function &fn = *first.frames.back().fn;
    for (const Thread &thread : threads)
      if (thread.state == Thread::State::Barrier && thread.barrierId == id &&
          thread.barrierCount != first.barrierCount)
        return fail(first, fn, first.waitPc, kLaunchFailed,
                    llvm::formatv("threads wait at barrier {0} with different "
                                  "thread counts: {1} expects {2}",
                                  id, nameOf(thread), thread.barrierCount));
    if (first.barrierCount) {
      // A GPU would complete the barrier once per count; more warps at it
      // than the count are refused here.
      std::optional<unsigned> warpsAt = wholeWarpsAt(first);
      if (!warpsAt)
        return false;
      arrived[id] = *warpsAt * 32;
      if (arrived[id] > first.barrierCount)
        return fail(first, fn, first.waitPc, kLaunchFailed,
                    llvm::formatv("{0} threads wait at barrier {1}, which "
                                  "expects {2}",
                                  arrived[id], id, first.barrierCount));
      if (arrived[id] == first.barrierCount) {
        completeBarrier(id);
        completed = true;
      }
      continue;
    }
    // Every thread of the block, at one instruction.
    if (exited)
      return fail(first, fn, first.waitPc, kLaunchFailed,
                  llvm::formatv("barrier reached by only some threads: {0} "
                                "exited without reaching it",
                                nameOf(*exited)));
    if (arrived[id] < threads.size())
      continue;
    for (const Thread &thread : threads)
      if (thread.frames.back().fn != first.frames.back().fn ||
          thread.waitPc != first.waitPc)
        return fail(first, fn, first.waitPc, kLaunchFailed,
                    llvm::formatv("threads wait at different barriers: {0} at "
                                  "PTX line {1}",
                                  nameOf(thread), lineOf(thread)));
    completeBarrier(id);
    completed = true;
  }
  if (completed)
    return true;
  // No barrier can complete and no thread can run.
  const Thread &first = *atBarrier;
  const Function &fn = *first.frames.back().fn;
  if (first.barrierCount)
    return fail(first, fn, first.waitPc, kLaunchFailed,
                llvm::formatv("deadlock: barrier {0} waits for {1} threads "
                              "and {2} arrived",
                              first.barrierId, first.barrierCount,
                              arrived[first.barrierId]));
  // The block's barrier waits for threads stalled at another barrier.
  const Thread &other = *llvm::find_if(threads, [&](const Thread &thread) {
    return thread.state == Thread::State::Barrier &&
           thread.barrierId != first.barrierId;
  });
  return fail(first, fn, first.waitPc, kLaunchFailed,
              llvm::formatv("threads wait at different barriers: {0} at PTX "
                            "line {1} (barrier {2})",
                            nameOf(other), lineOf(other), other.barrierId));
}

std::optional<unsigned> BlockRunner::wholeWarpsAt(const Thread &first) {
  // Each warp adds the warp size, as on a GPU; .aligned: every live lane of
  // a warp waits at the same bar.sync, or none does.
  auto isHere = [&](const Thread &lane) {
    return lane.state == Thread::State::Barrier &&
           lane.barrierId == first.barrierId && lane.waitPc == first.waitPc &&
           lane.frames.back().fn == first.frames.back().fn;
  };
  unsigned warpsAt = 0;
  for (unsigned w = 0; w < warps; ++w) {
    const Thread *here = nullptr, *elsewhere = nullptr;
    for (unsigned t = w * 32; t < std::min<size_t>(threads.size(), w * 32 + 32);
         ++t) {
      const Thread &lane = threads[t];
      if (lane.state == Thread::State::Exited)
        continue;
      const Thread *&seen = isHere(lane) ? here : elsewhere;
      if (!seen)
        seen = &lane;
    }
    if (here && elsewhere) {
      fail(*here, *first.frames.back().fn, first.waitPc, kLaunchFailed,
           llvm::formatv("a warp split at barrier {0}: thread ({1}, {2}, {3}) "
                         "is not at this bar.sync",
                         first.barrierId, elsewhere->tid[0], elsewhere->tid[1],
                         elsewhere->tid[2]));
      return std::nullopt;
    }
    warpsAt += here != nullptr;
  }
  return warpsAt;
}

void BlockRunner::completeBarrier(uint32_t id) {
  // The participants' warps learn what each of them has seen, and that
  // everything they did before now precedes what follows.
  uint32_t members = 0;
  unsigned participants = 0;
  for (const Thread &thread : threads)
    if (thread.state == Thread::State::Barrier && thread.barrierId == id) {
      members |= uint32_t(1) << (thread.linear / 32);
      ++participants;
    }
  ++now;
  llvm::SmallVector<uint32_t, 32> joined(warps, 0);
  for (uint32_t m = members; m; m &= m - 1)
    for (unsigned v = 0; v < warps; ++v)
      joined[v] = std::max(joined[v], clocks[llvm::countr_zero(m) * warps + v]);
  for (uint32_t m = members; m; m &= m - 1)
    joined[llvm::countr_zero(m)] = now;
  for (uint32_t m = members; m; m &= m - 1)
    std::copy(joined.begin(), joined.end(),
              clocks.begin() + llvm::countr_zero(m) * warps);
  for (Thread &thread : threads)
    if (thread.state == Thread::State::Barrier && thread.barrierId == id)
      makeReady(thread);
  ++barriers;
  barrierThreads += participants;
}

bool BlockRunner::run(unsigned index) {
  blockIndex = index;
  ctaid[0] = index % launch.grid[0];
  ctaid[1] = index / launch.grid[0] % launch.grid[1];
  ctaid[2] = index / (launch.grid[0] * launch.grid[1]);
  blockTime = ++now;
  std::fill(clocks.begin(), clocks.end(), blockTime);
  blockStart = executed();
  unwrittenRead = {};
  // Shared memory starts as a fixed pattern, so that results never depend
  // on which host thread ran the block (reading it unwritten is an error).
  std::fill(shared.begin(), shared.end(), 0xFF);
  ready.clear();
  readyHead = 0;
  std::fill(waitingLanes.begin(), waitingLanes.end(), 0);
  std::fill(goneLanes.begin(), goneLanes.end(), 0);
  if (unsigned partial = threads.size() % 32)
    goneLanes.back() = ~uint32_t(0) << partial;
  for (Thread &thread : threads) {
    thread.frames.clear();
    thread.pendingLoads.clear();
    thread.pc = 0;
    makeFrame(thread, context.kernel, 0);
    thread.frames.push_back({&context.kernel, 0, 0, nullptr});
    makeReady(thread);
  }
  for (;;) {
    while (readyHead < ready.size()) {
      Thread &thread = threads[ready[readyHead++]];
      switch (launch.trafficDetail ? execute<true>(thread)
                                   : execute<false>(thread)) {
      case Stop::Exit:
        markExited(thread);
        if (!completeShufflesAfterExit(thread))
          return false;
        break;
      case Stop::Barrier: thread.state = Thread::State::Barrier; break;
      case Stop::Shuffle:
        waitAtShuffle(thread);
        if (!arriveAtShuffle(thread))
          return false;
        break;
      case Stop::Error: return false;
      }
    }
    ready.clear();
    readyHead = 0;
    if (!resolveStalled())
      return false;
    if (ready.empty())
      return true;
  }
}

} // namespace

std::optional<LaunchError> tilefuse::emulator::execute(const Launch &launch,
                                                       LaunchRecord &record) {
  auto start = std::chrono::steady_clock::now();
  const Function &kernel = *launch.kernel;
  Context context(launch);
  context.threadCount = launch.block[0] * launch.block[1] * launch.block[2];
  context.blockCount = launch.grid[0] * launch.grid[1] * launch.grid[2];
  uint32_t sharedEnd = kernel.staticSharedBytes;
  for (const SharedArray &array : kernel.shared)
    if (array.dynamic)
      sharedEnd = std::max(sharedEnd, array.offset + launch.dynamicSharedBytes);
  context.sharedBytes = sharedEnd;
  for (const auto &fn : launch.module->functions)
    context.frameWords[fn.get()] = fn->frameWords();

  // Buffers with the same extent are one buffer ("param/param_out").
  for (const Buffer &buffer : launch.buffers) {
    if (buffer.bytes == 0)
      continue;
    auto same = llvm::find_if(context.ranges, [&](const BufferRange &range) {
      return range.begin == buffer.base &&
             range.end == buffer.base + buffer.bytes;
    });
    if (same != context.ranges.end()) {
      context.bufferNames[same->index] += "/" + buffer.name;
      continue;
    }
    context.ranges.push_back({buffer.base, buffer.base + buffer.bytes,
                              static_cast<unsigned>(context.ranges.size()),
                              false});
    context.bufferNames.push_back(buffer.name);
    context.bufferBegins.push_back(buffer.base);
    context.bufferBytes.push_back(buffer.bytes);
  }
  // The module's .global and .const variables.
  for (const GlobalVariable &variable : launch.module->globals) {
    context.ranges.push_back({variable.address,
                              variable.address + variable.bytes,
                              static_cast<unsigned>(context.ranges.size()),
                              variable.constant});
    context.bufferNames.push_back(variable.name);
    context.bufferBegins.push_back(variable.address);
    context.bufferBytes.push_back(variable.bytes);
  }
  std::stable_sort(context.ranges.begin(), context.ranges.end(),
                   [](const BufferRange &a, const BufferRange &b) {
                     return a.begin < b.begin;
                   });

  record.kernel = kernel.name;
  record.chip = launch.chip;
  std::copy_n(launch.grid, 3, record.grid);
  std::copy_n(launch.block, 3, record.block);
  record.declaredRegisters = kernel.declaredRegisters;
  record.minBlocksPerSM = kernel.minBlocksPerSM;
  record.sharedBytes = kernel.staticSharedBytes + launch.dynamicSharedBytes;

  unsigned workers =
      std::max(1u, std::min(launch.hostThreads, context.blockCount / 2));
  std::vector<std::unique_ptr<BlockRunner>> runners;
  for (unsigned i = 0; i < workers; ++i)
    runners.push_back(std::make_unique<BlockRunner>(context));
  std::atomic<unsigned> nextBlock{0}, failedBlock{UINT_MAX};
  std::vector<unsigned> failedAt(workers, UINT_MAX);
  auto work = [&](unsigned worker) {
    HostFloatingPoint ieee;
    BlockRunner &runner = *runners[worker];
    for (;;) {
      unsigned block = nextBlock.fetch_add(1);
      if (block >= context.blockCount || block > failedBlock.load())
        return;
      if (!runner.run(block)) {
        failedAt[worker] = block;
        unsigned seen = failedBlock.load();
        while (block < seen && !failedBlock.compare_exchange_weak(seen, block))
          ;
        return;
      }
    }
  };
  if (workers == 1) {
    work(0);
  } else {
    std::vector<std::thread> pool;
    for (unsigned i = 1; i < workers; ++i)
      pool.emplace_back(work, i);
    work(0);
    for (std::thread &thread : pool)
      thread.join();
  }

  // Counters from every runner; the error of the lowest failing block.
  record.buffers.resize(context.bufferNames.size());
  for (size_t i = 0; i < context.bufferNames.size(); ++i) {
    BufferTraffic &buffer = record.buffers[i];
    buffer.name = context.bufferNames[i];
    buffer.base = context.bufferBegins[i];
    buffer.bytes = context.bufferBytes[i];
  }
  std::optional<LaunchError> error;
  unsigned errorBlock = UINT_MAX;
  for (unsigned w = 0; w < workers; ++w) {
    BlockRunner &runner = *runners[w];
    for (size_t c = 0; c < kInstructionClasses; ++c)
      record.instructions[c] += runner.counts[c];
    record.barriers += runner.barriers;
    record.barrierThreads += runner.barrierThreads;
    record.shuffles += runner.shuffles;
    record.loadRoundTrips += runner.roundTrips;
    for (size_t i = 0; i < runner.traffic.size(); ++i) {
      const Traffic &traffic = runner.traffic[i];
      BufferTraffic &buffer = record.buffers[i];
      buffer.loadedBytes += traffic.loadedBytes;
      buffer.storedBytes += traffic.storedBytes;
      buffer.loads += traffic.loads;
      buffer.stores += traffic.stores;
      buffer.blockUniqueBytes += traffic.blockUnique;
    }
    if (runner.error && failedAt[w] < errorBlock) {
      errorBlock = failedAt[w];
      error = runner.error;
    }
  }
  // Sectors any block touched: the union of every runner's.
  if (launch.trafficDetail)
    for (size_t i = 0; i < context.bufferNames.size(); ++i) {
      std::vector<uint64_t> touched = runners[0]->traffic[i].launchBits;
      for (unsigned w = 1; w < workers; ++w)
        for (size_t word = 0; word < touched.size(); ++word)
          touched[word] |= runners[w]->traffic[i].launchBits[word];
      for (uint64_t word : touched)
        record.buffers[i].launchUniqueBytes += 32 * llvm::popcount(word);
    }
  record.seconds = std::chrono::duration<double>(
                       std::chrono::steady_clock::now() - start)
                       .count();
  return error;
}
