//===- RowProgram.h - what the row program lowering shares ------*- C++ -*-===//
//
// Private to the compiler library: the declarations the files of
// fuse-lower-to-gpu and fuse-lower-to-cpu share, in a named namespace so
// that they link across the files.
//
// The GPU and the CPU differ only in where rows and lanes come from and in
// how a reduction combines across the threads of a row (RowMapping).
//
//  - RowReductions.cpp: row reduction states and how they combine, exp and
//    tanh (MathLowering), conversions;
//  - RowProgramEmitter.cpp: the emitter of a kernel body (RowProgramEmitter);
//  - LoweredSignature.cpp: the lowered parameters and their binding;
//  - ColumnFinalize.cpp: the column reductions' finalize function;
//  - LowerToGPU.cpp, LowerToCPU.cpp: each target's row mapping, lowering and
//    pass;
//  - LowerMultiTensor.cpp: multi-tensor kernels (KernelABI.h), both targets.
//
//===----------------------------------------------------------------------===//

#ifndef TILEFUSE_COMPILER_LIB_ROWPROGRAM_H
#define TILEFUSE_COMPILER_LIB_ROWPROGRAM_H

#include "tilefuse/Compiler/KernelABI.h"
#include "tilefuse/Compiler/TileConfig.h"
#include "tilefuse/Dialect/Fuse/IR/Fuse.h"

#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/SCF/IR/SCF.h"
#include "mlir/Dialect/Vector/IR/VectorOps.h"
#include "mlir/IR/Builders.h"
#include "mlir/IR/BuiltinTypes.h"
#include "mlir/IR/TypeUtilities.h"

#include <optional>

namespace mlir {
class ModuleOp;
namespace func {
class FuncOp;
} // namespace func
namespace gpu {
class GPUModuleOp;
} // namespace gpu
} // namespace mlir

namespace tilefuse::lowering {

// The lowering's files use the MLIR and fuse names unqualified.
using namespace mlir;
using namespace tilefuse::fuse;

inline ValueType valueType(Value value) {
  return cast<ValueType>(value.getType());
}

inline bool isChunked(ValueKind kind) {
  return kind == ValueKind::Full || kind == ValueKind::Col;
}

//===----------------------------------------------------------------------===//
// Row reductions (RowReductions.cpp)
//===----------------------------------------------------------------------===//

/// A row reduction and the state a thread carries for it:
/// - a fuse.reduce to a row: the partial result;
/// - a fuse.arg_reduce: the best value so far and its column (i32);
/// - a fuse.max_sum_exp: the running max m and sum of exp(x - m);
/// - a fuse.max_deviation: the running max m, the sum of the weights w and
///   the sum of w * (x - m), each on one lane;
/// - a fuse.moments: the count, mean and sum of squared deviations of the
///   values shifted by the row's first element (merged by Chan's formula),
///   and the plain sum of the values (the mean where it is not large
///   against the spread: the shifted mean rounds at the size of x - x[row,
///   0] in every merge), each on one lane.
struct RowReduction {
  enum class Form { Plain, Arg, MaxSumExp, MaxDeviation, Moments };
  Operation *op;
  Form form;
  ReduceKind kind;
  Value input;
  Value weight = {}; // fuse.max_deviation's

  static std::optional<RowReduction> of(Operation *op) {
    if (auto reduce = dyn_cast<ReduceOp>(op); reduce && reduce.isRowReduction())
      return RowReduction{op, Form::Plain, reduce.getKind(), reduce.getInput()};
    if (auto arg = dyn_cast<ArgReduceOp>(op))
      return RowReduction{op, Form::Arg, arg.getKind(), arg.getInput()};
    if (auto online = dyn_cast<MaxSumExpOp>(op))
      return RowReduction{op, Form::MaxSumExp, ReduceKind::Sum,
                          online.getInput()};
    if (auto deviation = dyn_cast<MaxDeviationOp>(op))
      return RowReduction{op, Form::MaxDeviation, ReduceKind::Sum,
                          deviation.getInput(), deviation.getWeight()};
    if (auto moments = dyn_cast<MomentsOp>(op))
      return RowReduction{op, Form::Moments, moments.getKind(),
                          moments.getInput()};
    return std::nullopt;
  }
  bool isArg() const { return form == Form::Arg; }
  size_t stateSize() const {
    switch (form) {
    case Form::Plain:
      return 1;
    case Form::Arg:
    case Form::MaxSumExp:
      return 2;
    case Form::MaxDeviation:
      return 3;
    case Form::Moments:
      return 4;
    }
    llvm_unreachable("unknown form");
  }
};
using ReductionState = SmallVector<Value, 2>;

/// Points each max-deviation state's max at the max of a sum of exp about
/// the max of the same input (label smoothing's sum of log-probabilities
/// beside the log-sum-exp). Both start at -inf and grow alike, so they are
/// the same value; once they are one SSA value, CSE leaves one chunk max,
/// one running max and one x - max for both, and LLVM one register.
void shareRunningMaxes(ArrayRef<RowReduction> reductions,
                       MutableArrayRef<ReductionState> states);

/// The row reductions of `kernel` whose input is available after pass
/// `level` (all of them for level -1), in program order.
SmallVector<RowReduction>
rowReductions(KernelOp kernel, const DenseMap<Value, int> &levels, int level);

/// The column reduction an output stores, looking through the cast to the
/// storage dtype that specialization adds; null if there is none.
ReduceOp columnReductionOf(Value output);

/// The neutral element of a reduction, as an attribute of `type`.
TypedAttr reductionIdentity(ReduceKind kind, Type type);

/// Combines two partial results of a reduction (NaN-propagating max/min).
Value combineReduction(OpBuilder &b, Location loc, ReduceKind kind, Value lhs,
                       Value rhs);

/// `create` applied to `args`. On a GPU a transcendental runs per element
/// (`perElement`): it lowers to scalar instructions or libdevice calls, not
/// to vector forms. On the CPU it stays a vector, for
/// fuse-approximate-math's vector polynomials.
Value emitMath(OpBuilder &b, Location loc, ValueRange args, bool perElement,
               function_ref<Value(ValueRange)> create);

/// How exp and tanh are emitted. On a GPU they run per element; where the
/// kernel stores 16-bit floats, their f32 forms are cheaper than libdevice's
/// and still far below the storage's rounding (bf16 2^-9, f16 2^-12):
/// - exp(x) is ex2.approx(x * log2(e)) (as Triton emits it: two
///   instructions instead of libdevice's ~10; relative error about
///   2^-22 + |x| * 2^-24);
/// - tanh(x) is 1 - 2 / (1 + ex2.approx(2x * log2(e))) with div.approx
///   (saturates to +-1, NaN stays NaN), and x * (1 - x^2 / 3) for
///   |x| < 1/16, where that difference loses relative accuracy: with PTX's
///   2-ulp bounds for both approximations, relative error at most 2^-17
///   (worst just above 1/16), absolute under 2^-20; 10 instructions instead
///   of libdevice's 17.
/// Elsewhere math.exp and math.tanh (libdevice on a GPU, polynomials on the
/// CPU).
struct MathLowering {
  bool perElement = false;
  bool approximate = false;

  static MathLowering of(const TileConfig &config, const KernelShape &shape) {
    return {config.isGPU(), config.isGPU() && shape.storageBytes == 2};
  }
  Value exp(OpBuilder &b, Location loc, Value x) const;
  Value tanh(OpBuilder &b, Location loc, Value x) const;

private:
  bool cheapFor(Value x) const {
    return approximate && getElementTypeOrSelf(x.getType()).isF32();
  }
};

/// A float constant of `like`'s type (splat for vectors).
Value floatConstant(OpBuilder &b, Location loc, Value like, double value);

/// What an online state keeps its terms about for running max `max`: the
/// max, or 0 while the max is -inf (nothing but -inf so far), which keeps
/// -inf - -inf out.
Value runningCenter(OpBuilder &b, Location loc, Value max);

/// What a max-deviation state's sum, kept about `from`'s runningCenter,
/// loses when its max grows to `to`: (to - center) times its sum of
/// weights, or nothing where the max did not grow (two -inf maxes, or the
/// same).
Value deviationShift(OpBuilder &b, Location loc, Value from, Value to,
                     Value weights);

/// Chan's merge of two moments states (count, mean, M2, sum):
/// mean = mean_a + d * n_b / n, M2 = M2_a + M2_b + d^2 * n_a * n_b / n with
/// d = mean_b - mean_a (two empty states merge to an empty one); the sums
/// add.
ReductionState combineMoments(OpBuilder &b, Location loc, ArrayRef<Value> lhs,
                              ArrayRef<Value> rhs);

/// Combines two states of `reduction`, as scalars or vectors.
ReductionState combineStates(OpBuilder &b, Location loc,
                             const RowReduction &reduction, ArrayRef<Value> lhs,
                             ArrayRef<Value> rhs, const MathLowering &lowering);

vector::CombiningKind vectorCombiningKind(ReduceKind kind, bool isFloat);

/// `value` as the float type (or vector of floats) `type`: extended if that
/// is wider, truncated if narrower. bf16 <-> f16 goes exactly through f32,
/// then rounds once; f64 -> f16/bf16 rounds to f32 first, as PyTorch's
/// conversions do (and the CPU JIT has no __truncdfhf2/__truncdfbf2 to call).
Value castFloat(OpBuilder &b, Location loc, Value value, Type type);

/// `input` (a value or vector) converted to the element type of `type`, as
/// fuse.cast converts: floats by castFloat, floats to integers toward zero,
/// masks (i1) as 0/1, other integers sign-extended or truncated.
Value convertElements(OpBuilder &b, Location loc, Value input, Type type);

inline Value indexConstant(OpBuilder &b, Location loc, int64_t value) {
  return arith::ConstantIndexOp::create(b, loc, value);
}

/// Terms per block of a blocked accumulation (PyTorch's CPU sums use 16 too).
constexpr int64_t kAccumulationBlock = 16;

/// Folds terms [0, count) into accumulators that start at `identities`, in
/// blocks: the terms of each block of kAccumulationBlock are folded in order
/// (`accumulate(index, accumulators)` returns the new accumulators) into a
/// partial that starts from the identities, kAccumulationBlock of those
/// partials likewise (`combine(lhs, rhs)`), and so on through enough levels
/// for `maxCount` terms (more terms still fold correctly: the top level
/// takes them all). A sum's rounding error grows with the number of levels
/// rather than with `count`, and up to kAccumulationBlock terms it is one
/// plain loop. Any associative combination works: sums, max/min, and merged
/// states such as (max, sum of exp) or (count, mean, M2).
SmallVector<Value> emitBlockedAccumulation(
    OpBuilder &b, Location loc, Value count, int64_t maxCount,
    ValueRange identities,
    function_ref<SmallVector<Value>(Value, ValueRange)> accumulate,
    function_ref<SmallVector<Value>(ValueRange, ValueRange)> combine);

//===----------------------------------------------------------------------===//
// The emitter (RowProgramEmitter.cpp)
//===----------------------------------------------------------------------===//

/// Unrolls the marked loops under `root` (GPU only), so that a thread has
/// several independent loads in flight rather than one.
void unrollStreamLoops(Operation *root);

/// Where rows, lanes and row groups come from, and how a row reduction
/// combines across the threads of a row.
class RowMapping {
public:
  virtual ~RowMapping() = default;
  /// The thread's position within its row (0 on the CPU).
  virtual Value lane() = 0;
  /// Combines per-thread states of several reductions into row results,
  /// valid in every thread of the row.
  virtual SmallVector<ReductionState>
  combineAcrossRow(OpBuilder &b, Location loc,
                   ArrayRef<RowReduction> reductions,
                   ArrayRef<ReductionState> states) = 0;
  /// Whether this thread stores the row's per-row outputs.
  virtual Value isRowLeader(OpBuilder &b, Location loc) = 0;
};

/// Both conditions; a null one holds.
Value andConditions(OpBuilder &b, Location loc, Value lhs, Value rhs);

/// Runs `body` only where `condition` holds (no-op when it is null).
template <typename Fn>
void emitGuarded(OpBuilder &b, Location loc, Value condition, Fn body) {
  if (!condition) {
    body();
    return;
  }
  auto guard = scf::IfOp::create(b, loc, condition, /*withElseRegion=*/false);
  OpBuilder::InsertionGuard insertion(b);
  b.setInsertionPointToStart(guard.thenBlock());
  body();
}

/// The emitter for one kernel body. `pointers` and `scalars` map the fuse
/// kernel's inputs and outputs to the lowered function's arguments.
class RowProgramEmitter {
public:
  RowProgramEmitter(KernelOp kernel, const TileConfig &config,
                    const KernelShape &shape, RowMapping &mapping,
                    OpBuilder &builder);

  /// Binds input `index` of the kernel to a lowered argument (a pointer for
  /// tensors, the value for scalars).
  void bindInput(unsigned index, Value argument) {
    inputs[kernel.getEntryBlock().getArgument(index)] = argument;
  }
  void bindOutput(unsigned index, Value pointer) { outputs[index] = pointer; }

  LogicalResult checkSupported();
  /// Staged rows and on-chip partials (TileConfig.h): `blockBase` points to
  /// the block's dynamic shared memory, `groupBytes` of it per row group
  /// (this thread's is `groupInBlock`): the column partials' regions first,
  /// then the re-read inputs'. `aloneOnSM`: no second block fits beside
  /// this one (runsAloneOnSM), so its threads may take every register.
  void bindStage(Value blockBase, Value groupInBlock, int64_t groupBytes,
                 bool aloneOnSM);
  /// Fills this row group's column-reduction partials with the identity.
  void emitPartialsInit(Value rowGroup);
  /// Partials on chip: the block's `groups` row groups' combined in order
  /// (by the first row group's threads), written to row `partialRow` of the
  /// global partials.
  void emitPartialsFlush(Value partialRow, Value groups);
  /// Emits the whole program for `row` (valid rows only store).
  LogicalResult emitRow(Value row, Value rowValid, Value rowGroup);

  /// Whether a pass issued a group of chunks' loads ahead of their work.
  bool loadsAhead() const { return preloaded; }

  /// Elementwise kernels (multi-tensor): computes every scalar value from
  /// the bound inputs, where it dominates the emitElementwiseAt calls.
  LogicalResult emitScalarValues();
  /// Elementwise kernels: computes every output at element `offset` of the
  /// bound pointers, one vector of the config's width, and stores it.
  void emitElementwiseAt(Value offset);

private:
  struct Chunk {
    Value base;  // first column of this thread's vector
    Value valid; // i1: base < n (null when every lane's vector is full)
    bool unrolled = false;      // a constant index: a chunk of a row on chip
    Value slot;                 // chunk * threads_per_row + lane, unclamped
    bool staged = false;        // its re-read inputs live in shared memory
    bool partialOnChip = false; // its column partials live there
    DenseMap<Value, Value> values;
  };

  void computeLevels();
  VectorType chunkType(Type elementType) {
    return VectorType::get({config.vectorWidth}, elementType);
  }
  Type loweredType(ValueType type) {
    return isChunked(type.getKind()) ? Type(chunkType(type.getElementType()))
                                     : type.getElementType();
  }
  Value pointerAt(Value pointer, Type elementType, Value offset);
  unsigned alignment(Type type);
  /// A load from global or shared memory; on a GPU, where `predicate` is
  /// given, one that moves no bytes when it is off (and yields zeros).
  Value load(Value pointer, Type type, Value offset, unsigned align = 0,
             Value predicate = {});
  void store(Value value, Value pointer, Value offset, unsigned align = 0);
  void preloadInputs(MutableArrayRef<Chunk> chunks,
                     ArrayRef<BlockArgument> chunkInputs);
  SmallVector<BlockArgument> passInputs(ArrayRef<RowReduction> reductions,
                                        bool isFinal);
  /// Whether the pass stores full outputs or column partials per chunk.
  bool storesOutputs(bool isFinal) {
    auto yield = cast<YieldOp>(kernel.getEntryBlock().getTerminator());
    return isFinal && llvm::any_of(yield.getValues(), [](Value output) {
             return isChunked(valueType(output).getKind());
           });
  }
  Value sharedOffset(const Chunk &chunk);
  /// Row group `group`'s region at `offset` bytes into its shared memory.
  Value sharedRegion(Value group, int64_t offset);
  /// A loop over this thread's chunks [first, end), `body(chunk)` in it.
  void forEachChunk(int64_t first, int64_t end,
                    function_ref<void(Chunk &)> body);
  void streamChunks(int64_t first, int64_t count, bool staged,
                    ArrayRef<RowReduction> reductions, bool isFinal,
                    SmallVectorImpl<ReductionState> &accumulators);
  Value flatOffset(Value row, Value column);

  LogicalResult emitRowScopeOps(int level);
  Value emitInChunk(Chunk &chunk, Value value);
  Value emitElementwise(Operation *op, ValueRange operands, Type resultType);
  Value emitGather(GatherOp gather);
  Value loadGatherSource(Value source, Value column, Value predicate);
  /// Before a later pass over a wide row on chip (TileConfig.h) whose
  /// earlier passes compute only cheap values: forgets those, so that the
  /// pass computes them again from the 16-bit loads, which stay packed.
  void holdLoadsPacked();
  LogicalResult emitPass(int level, bool isFinal,
                         ArrayRef<RowReduction> reductions);
  void emitChunkWork(Chunk &chunk, bool isFinal,
                     ArrayRef<RowReduction> reductions,
                     SmallVectorImpl<ReductionState> &accumulators);
  bool foldsToOneLane(const RowReduction &reduction) const;
  /// The identity of a thread's state of `reduction`.
  ReductionState identityState(const RowReduction &reduction);
  ReductionState identityState(const RowReduction &reduction, int64_t lanes);
  ReductionState chunkState(Chunk &chunk, const RowReduction &reduction);
  ReductionState accumulateChunk(Chunk &chunk, const RowReduction &reduction,
                                 ArrayRef<Value> accumulator);
  Value foldIntoLane(vector::CombiningKind kind, Value terms, Value lane);
  ReductionState accumulateMoments(Chunk &chunk, const RowReduction &reduction,
                                   ArrayRef<Value> accumulator);
  ReductionState accumulateMaxDeviation(Chunk &chunk,
                                        const RowReduction &reduction,
                                        ArrayRef<Value> accumulator);
  ReductionState accumulateMaxSumExp(Chunk &chunk,
                                     const RowReduction &reduction,
                                     ArrayRef<Value> accumulator);
  ReductionState reduceLanes(const RowReduction &reduction,
                             ArrayRef<Value> state);
  Chunk makeChunk(Value chunkIndex);

  KernelOp kernel;
  const TileConfig &config;
  int64_t n;
  bool aligned;
  RowMapping &mapping;
  OpBuilder &b;
  Location loc;
  MathLowering mathLowering;

  DenseMap<Value, Value> inputs;     // fuse input -> lowered argument
  DenseMap<unsigned, Value> outputs; // output index -> pointer
  DenseMap<Value, int> levels;
  DenseMap<Value, Value> rowValues;           // per-row and scalar values
  DenseMap<Operation *, Value> momentShifts;  // fuse.moments -> its row's shift
  SmallVector<Chunk> onChipChunks;            // reused by every pass
  DenseMap<Value, Value> stagePointers;       // re-read input -> its region
  DenseMap<unsigned, Value> partialPointers;  // column output -> its region
  DenseMap<unsigned, int64_t> partialOffsets; // ... its offset in a group's
  Value stageBase, groupInBlock;
  int64_t stageGroupBytes = 0;
  /// Vectors of full inputs a loop over staged chunks loads an iteration
  /// (kStagedLoads where the block runs alone on its SM).
  int64_t stagedLoads = kStagedUnroll;
  DenseSet<Value> inSharedMemory; // staged by an earlier pass
  DenseSet<Value> stagedThisPass;
  Value row, rowValid, rowGroup;
  bool plainsOnOneLane = false; // this pass's (foldsToOneLane)
  int maxLevel = 0;
  int finalLevel = 0;
  bool preloaded = false;
  /// The kernel writes column partials (KernelShape::hasColumnReduction).
  bool hasColumnReduction;
  bool predicatedLoads;
  /// holdLoadsPacked applies: a wide 16-bit row on chip whose earlier
  /// passes compute only cheap values (earlierPassesAreCheap).
  bool loadsHeldPacked;
  /// The per-column inputs that load with the row (columnsToLoadWithRow).
  SmallVector<BlockArgument> columnsLoadedWithRow;
  /// What a load of this row's data is predicated on: the row being in the
  /// launch, with predicatedLoads (null: always loads).
  Value rowLoadPredicate() const {
    return predicatedLoads ? rowValid : Value();
  }
};

//===----------------------------------------------------------------------===//
// The targets' row mappings (LowerToGPU.cpp, LowerToCPU.cpp)
//===----------------------------------------------------------------------===//

class GPURowMapping : public RowMapping {
public:
  GPURowMapping(const TileConfig &config, MathLowering math, Value laneIndex,
                Value groupInBlock, Value workgroup, int64_t maxReductions)
      : config(config), math(math), laneIndex(laneIndex),
        groupInBlock(groupInBlock), workgroup(workgroup),
        maxReductions(maxReductions),
        namedBarriers(foldsResidentBlocks(config)) {}

  Value lane() override { return laneIndex; }

  Value isRowLeader(OpBuilder &b, Location loc) override;

  SmallVector<ReductionState>
  combineAcrossRow(OpBuilder &b, Location loc,
                   ArrayRef<RowReduction> reductions,
                   ArrayRef<ReductionState> partials) override;

private:
  /// `state` combined with the states of the lanes whose index differs in
  /// the bits below `lanes` (a power of two at most 32), by butterfly
  /// shuffles: each lane combines its own state with its partner's, so the
  /// lanes agree bit for bit where the combine is commutative (sums, max,
  /// min, arg reductions' lowest index, online softmax), not in Chan's
  /// merge of moments.
  ReductionState butterfly(OpBuilder &b, Location loc,
                           const RowReduction &reduction, ReductionState state,
                           int64_t lanes);

  /// The butterfly, after which every lane of each group of `lanes` holds
  /// the same bits: where the combine is not commutative, the group's first
  /// lane's.
  ReductionState combineAcrossLanes(OpBuilder &b, Location loc,
                                    const RowReduction &reduction,
                                    ReductionState state, int64_t lanes);

  /// The row group's warps meet: at the block's barrier, or, where row
  /// groups of a folded block go at their own pace, at the group's named
  /// barrier (1 + the group; 0 is the block's).
  void synchronizeRow(OpBuilder &b, Location loc);

  // Workgroup memory holds f32, or f64 where a row reduction's states are 64
  // bits wide (f64, i64).
  Type slotType() const;
  /// A float in the slot's type; an integer (a sum, an extreme, an arg
  /// reduction's i32 column) as its bits.
  Value toSlot(OpBuilder &b, Location loc, Value value) const;
  Value fromSlot(OpBuilder &b, Location loc, Value slotValue, Type type) const;

  const TileConfig &config;
  MathLowering math;
  Value laneIndex, groupInBlock, workgroup;
  int64_t maxReductions;
  bool namedBarriers;
};

class CPURowMapping : public RowMapping {
public:
  explicit CPURowMapping(OpBuilder &b, Location loc);
  Value lane() override;
  Value isRowLeader(OpBuilder &, Location) override;
  SmallVector<ReductionState>
  combineAcrossRow(OpBuilder &, Location, ArrayRef<RowReduction>,
                   ArrayRef<ReductionState> partials) override;

private:
  Value zero;
};

/// A CPU kernel's entry function, named after `kernel`: `parameters`, then
/// the four i64 that give a thread its share of the work (KernelABI.h);
/// `b` at the start of its body (LowerToCPU.cpp).
func::FuncOp createCPUEntry(OpBuilder &b, Location loc, KernelOp kernel,
                            SmallVector<Type> parameters);

/// `function`'s argument `fromEnd` places from its end (1: the last), as an
/// index.
Value trailingIndex(OpBuilder &b, Location loc, func::FuncOp function,
                    unsigned fromEnd);

//===----------------------------------------------------------------------===//
// Shared by both targets: the lowered signature (LoweredSignature.cpp) and
// the finalize function (ColumnFinalize.cpp).
//===----------------------------------------------------------------------===//

/// The lowered parameter types of `kernel` (KernelABI.h), without the
/// target's trailing index parameters.
SmallVector<Type> loweredParameters(KernelOp kernel, Type pointer,
                                    const KernelAbi &abi);

/// The element type a KernelAbi names (f32, f16, bf16, f64, i1, i32, i64).
Type abiDtype(MLIRContext *context, StringRef name);

/// Reads a scalar bound by pointer (`pointee` there) as input `index`'s
/// declared type.
Value readScalar(OpBuilder &b, Location loc, KernelOp kernel, unsigned index,
                 Value address, Type pointee);

/// Binds the lowered arguments of a row program (inputs, then outputs),
/// reading the scalars bound by pointer once, here.
void bindArguments(RowProgramEmitter &emitter, OpBuilder &b, Location loc,
                   KernelOp kernel, const KernelAbi &abi, ValueRange arguments);

/// Column-reduction outputs: (reduction, storage element type).
SmallVector<std::pair<ReduceOp, Type>> columnReductions(KernelOp kernel);

/// How many partial rows a finalize's blocked accumulation is laid out for
/// (more still add up right, the top level taking them all; each level
/// costs loop bounds in every thread): the CPU has one per
/// kCpuRowsPerPartial rows; a GPU slice a finalizeSlices(n)-th of at most
/// 4 blocks per SM (TileConfig.h; or of their row groups, for partials that
/// do not fit on chip): a few hundred on today's chips.
constexpr int64_t kMaxCpuPartialRows = int64_t(1) << 24;
constexpr int64_t kMaxSliceRows = 256;

/// A finalize's arguments: (partials, output) per column reduction, then
/// row_groups and rows (i64).
Value finalizeRowGroups(OpBuilder &b, Location loc, KernelOp kernel,
                        ValueRange arguments);

/// For each column reduction: the combination of partials[g, column] over
/// partial rows g in [first, first + count), in blocks laid out for `maxCount`
/// rows. A thread takes `group` rows per iteration, all loaded before any is
/// combined (independent loads in flight) from one address at constant offsets,
/// and adds their total; the last group's rows past `count` are not loaded (on
/// a GPU, loads predicated on the row), so the rows left over do not take a
/// round trip to memory each; `group` > 1 only on a GPU (inline PTX). (Rows
/// indexed one by one in an unrolled loop gave LLVM eight loop-invariant bases,
/// which its loop strength reduction searched for 45-50% of the finalize's code
/// generation.) With `freezeStart` the first row's address is frozen: loop
/// strength reduction otherwise searches the rewrites of each of its terms (the
/// partials, `first`, the block's and the thread's column) for every load
/// (10-13 ms of a GPU finalize's code generation).
SmallVector<Value> combinePartials(OpBuilder &b, Location loc, KernelOp kernel,
                                   ValueRange arguments, Value column,
                                   int64_t n, Value first, Value count,
                                   int64_t maxCount, int64_t group,
                                   bool freezeStart);

/// out[column] = total (a mean divided by rows), in the output's dtype.
void storeFinalized(OpBuilder &b, Location loc, KernelOp kernel,
                    ValueRange arguments, Value column, ArrayRef<Value> totals);

SmallVector<Type> finalizeParameters(KernelOp kernel, Type pointer);

//===----------------------------------------------------------------------===//
// Multi-tensor kernels (LowerMultiTensor.cpp)
//===----------------------------------------------------------------------===//

/// The multi-tensor configuration of `kernel`, when it is one.
struct MultiTensorKernel {
  TileConfig config;
  KernelShape shape;
  KernelAbi abi;
};
FailureOr<std::optional<MultiTensorKernel>> multiTensorKernel(KernelOp kernel);

LogicalResult lowerMultiTensorKernelToGPU(KernelOp kernel,
                                          gpu::GPUModuleOp module,
                                          const TileConfig &config,
                                          const KernelShape &shape,
                                          const KernelAbi &abi);

LogicalResult lowerMultiTensorKernelToCPU(KernelOp kernel, ModuleOp module,
                                          const TileConfig &config,
                                          const KernelShape &shape,
                                          const KernelAbi &abi);

} // namespace tilefuse::lowering

#endif // TILEFUSE_COMPILER_LIB_ROWPROGRAM_H
