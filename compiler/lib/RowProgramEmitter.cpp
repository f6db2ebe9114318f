//===- RowProgramEmitter.cpp - a kernel body as a row program -------------===//
//
// One emitter serves both targets. A row program runs in passes over the
// row's columns: pass L computes the row reductions whose inputs need only
// per-row values of level < L, and the last pass stores the full outputs and
// accumulates column reductions. Per-row and scalar values are computed once
// per row between passes. Each thread owns `chunks` vectors of `V` columns
// of its row; with the row on chip the chunk loop is unrolled and every
// loaded or computed vector is reused by later passes, otherwise a loop
// streams the row and recomputes what a pass needs.
//
// Where rows and lanes come from, and how a reduction combines across the
// threads of a row, is the target's (RowMapping: LowerToGPU.cpp,
// LowerToCPU.cpp).
//
//===----------------------------------------------------------------------===//

#include "PredicatedLoad.h"
#include "RowProgram.h"

#include "mlir/Dialect/GPU/IR/GPUDialect.h"
#include "mlir/Dialect/LLVMIR/LLVMDialect.h"
#include "mlir/Dialect/Math/IR/Math.h"
#include "mlir/Dialect/SCF/Utils/Utils.h"
#include "mlir/Dialect/Utils/StaticValueUtils.h"
#include "llvm/ADT/TypeSwitch.h"

#include <limits>
#include <numeric>

using namespace mlir;
using namespace tilefuse;
using namespace tilefuse::fuse;

namespace tilefuse::lowering {

/// How many times the shifted mean and the spread together a row's mean
/// must be for the moments' shifted mean to be taken over the sum's.
constexpr double kShiftedMeanMargin = 8;

/// Marks loops over a streamed row's chunks with their unroll factor until
/// unrollStreamLoops.
constexpr StringLiteral kStreamLoopAttr = "tilefuse.stream_loop";

/// Chunks of a streamed row a GPU thread loads per iteration of a pass that
/// stores over global memory (but see kFinalPassGroup). Staged chunks go
/// kStagedUnroll or kStagedLoads at a time.
constexpr int64_t kStreamGroup = 2;

/// Chunks per iteration of a merged reduction's pass (online softmax,
/// Welford's moments). While every thread read every warp's row state this
/// was 2: 4 made ptxas spill 4-12 bytes in the streamed cross-entropy
/// (sm_90, n = 32000-262144). Since the warps' states meet in shuffles
/// (combineAcrossRow) 4 spills nothing: cross_entropy_fwd bf16 n = 128256
/// keeps 65 KiB in flight per SM instead of 33 (76% -> 98% of HBM in the
/// traffic model), layer_norm_fwd's streamed rows 45-50 -> 53-61 KiB.
constexpr int64_t kMergedPassGroup = 4;

/// Chunks per iteration of the pass that stores a row's outputs after
/// earlier passes reduced it, when it reduces nothing itself: its registers
/// hold no reduction's state.
constexpr int64_t kFinalPassGroup = 4;

/// kStagedLoads (TileConfig.h): vectors of full inputs a thread loads per
/// iteration of the pass that stages a row, which holds them until its
/// shared-memory stores, where the block runs alone on its SM (elsewhere
/// kStagedUnroll: at f32 n = 20000 and bf16 48000 two blocks fit, and
/// eight took cross_entropy_fwd_grad from 52-64 registers to 122-128, one
/// block, 100% -> 61-78% of HBM in the traffic model); 4 everywhere
/// before the warps' states met in shuffles.
/// rms_norm_fwd bf16 n = 128256 keeps 69 KiB in flight per SM instead of 35
/// (77% -> 93% of HBM in the traffic model). Later passes over a row staged
/// whole take as many chunks (at least kStagedUnroll): layer_norm_fwd f32
/// n = 32000 70% -> 100%. Over part of a row (bf16 n = 128256 on sm_86:
/// 4-20 bytes), or with two full inputs (the probability-target
/// cross-entropy kernels: 4-84 bytes), eight chunks there made ptxas spill.
/// A row of more than kStagedLoadsMaxChunks chunks a thread stages
/// kStagedUnroll vectors an iteration: at 64 (bf16 n = 262144) eight made
/// ptxas spill 56-108 bytes in rms_norm_fwd and its variants on sm_80.
constexpr int64_t kStagedLoadsMaxChunks = 32;

void unrollStreamLoops(Operation *root) {
  SmallVector<std::pair<scf::ForOp, int64_t>> loops;
  root->walk([&](scf::ForOp loop) {
    if (auto factor = loop->getAttrOfType<IntegerAttr>(kStreamLoopAttr)) {
      loops.push_back({loop, factor.getInt()});
      loop->removeAttr(kStreamLoopAttr);
    }
  });
  for (auto [loop, factor] : loops)
    (void)loopUnrollByFactor(loop, factor);
}

/// Per-element work a pass can redo for fewer instructions than it takes
/// to hold the result in registers across passes: no transcendental, no
/// division. (A column reduction is not: its partials must stay.)
static bool isCheapToRecompute(Operation *op) {
  return isa<CastOp, AddOp, SubOp, MulOp, FmaOp, NegOp, AbsOp, MaximumOp,
             MinimumOp, FloorOp, RoundOp, CmpOp, SelectOp, BroadcastOp,
             ConstantOp, IotaOp, RowLengthOp>(op);
}

/// Whether every per-element value the passes before the last compute is
/// cheap to recompute (what the last pass computes is never held). Not
/// only what a later pass needs again: where an earlier pass computes an
/// exp, recomputing the casts around it freed no register
/// (cross_entropy_fwd_grad bf16 n = 32000: 128 either way, 75% -> 66% of
/// HBM in the traffic model).
static bool earlierPassesAreCheap(KernelOp kernel) {
  SmallVector<SmallVector<Value>> passes = passChunkValues(kernel);
  for (const SmallVector<Value> &values : ArrayRef(passes).drop_back())
    for (Value value : values)
      if (!isa<BlockArgument>(value) &&
          !isCheapToRecompute(value.getDefiningOp()))
        return false;
  return true;
}

/// The per-column inputs a row kept on chip loads with the row, before its
/// reductions' barriers, rather than a round trip after them: those only
/// its final pass reads (a norm's weight and bias). One round trip a row
/// instead of two, for more registers (rms_norm_fwd bf16 n = 4096: 64 -> 80
/// registers, 4 -> 3 blocks per SM, 92% -> 100% of HBM in the traffic
/// model; layer_norm_fwd 80 -> 127, 3 -> 2, 65% -> 78%). Only 16-bit rows
/// and columns: wider ones take twice the registers (layer_norm_fwd f32 n =
/// 1000: 64 -> 94, 94% -> 88%; bf16 x with f32 weight and bias at n = 4096:
/// 80 -> 172). Not wide rows (layer_norm_fwd bf16 n = 32000: 64 -> 128,
/// 100% -> 77%) nor the persistent grids of column reductions.
static SmallVector<BlockArgument>
columnsToLoadWithRow(KernelOp kernel, const KernelShape &shape,
                     const TileConfig &config) {
  SmallVector<BlockArgument> columns;
  if (!config.isGPU() || !config.rowOnChip || shape.storageBytes != 2 ||
      keepsWideRowOnChip(shape, config) || shape.hasColumnReduction)
    return columns;
  SmallVector<SmallVector<Value>> passes = passChunkValues(kernel);
  if (passes.size() < 2)
    return columns;
  DenseSet<Value> readEarlier;
  for (const SmallVector<Value> &values : ArrayRef(passes).drop_back())
    readEarlier.insert(values.begin(), values.end());
  for (Value value : passes.back()) {
    auto input = dyn_cast<BlockArgument>(value);
    if (input && valueType(input).getKind() == ValueKind::Col &&
        storageBytes(valueType(input).getElementType()) == 2 &&
        !readEarlier.contains(input))
      columns.push_back(input);
  }
  return columns;
}

RowProgramEmitter::RowProgramEmitter(KernelOp kernel, const TileConfig &config,
                                     const KernelShape &shape,
                                     RowMapping &mapping, OpBuilder &builder)
    : kernel(kernel), config(config), n(shape.n), aligned(shape.aligned),
      mapping(mapping), b(builder), loc(kernel.getLoc()),
      mathLowering(MathLowering::of(config, shape)),
      hasColumnReduction(shape.hasColumnReduction),
      // Predicated loads of a row zero their registers first (a move per
      // 32 bits: 7-17% more instructions at n = 1000 in the backward
      // norms, and issue-bound cross-entropy kernels lost 1-5% in the
      // traffic model); they pay where bytes count, in the HBM-bound
      // persistent grids of column reductions, whose blocks of several
      // row groups end with clamped rows and whose short rows end with
      // vectors past them. Elsewhere a tail vector or the last block's
      // clamped row reads what its neighbours just did (L1). (A gather's
      // one predicated load, emitGather, is not a row's.)
      predicatedLoads(config.isGPU() && hasColumnReduction),
      loadsHeldPacked(shape.storageBytes == 2 &&
                      keepsWideRowOnChip(shape, config) &&
                      earlierPassesAreCheap(kernel)),
      columnsLoadedWithRow(columnsToLoadWithRow(kernel, shape, config)) {}

void RowProgramEmitter::computeLevels() {
  levels = rowLevels(kernel);
  for (auto [value, level] : levels)
    maxLevel = std::max(maxLevel, level);
  finalLevel = finalPassLevel(kernel, levels);
}

LogicalResult RowProgramEmitter::checkSupported() {
  auto yield = cast<YieldOp>(kernel.getEntryBlock().getTerminator());
  for (auto [index, value] : llvm::enumerate(yield.getValues())) {
    ValueKind kind = valueType(value).getKind();
    if (kind == ValueKind::Scalar)
      return kernel.emitError("output #")
             << index << ": scalar outputs cannot be lowered; return a "
             << "per-row value instead";
    if (kind == ValueKind::Col && !columnReductionOf(value))
      return kernel.emitError("output #")
             << index << ": a per-column output must be a column reduction";
  }
  // A column reduction is complete only after every row: the rows of the
  // same launch cannot read it.
  auto onlyOutput = [](Value value, auto &self) -> bool {
    return llvm::all_of(value.getUsers(), [&](Operation *user) {
      auto cast = dyn_cast<CastOp>(user);
      return isa<YieldOp>(user) || (cast && self(cast.getResult(), self));
    });
  };
  for (ReduceOp reduce : kernel.getOps<ReduceOp>())
    if (!reduce.isRowReduction() && !onlyOutput(reduce.getResult(), onlyOutput))
      return reduce.emitError("a column reduction (over the rows) can only be "
                              "an output: it is complete after every row, so "
                              "nothing in the same fusion can use it; use it "
                              "in a second fusion");
  // Integer division: a zero divisor (or INT_MIN / -1) traps a CPU, killing
  // the process, and gives no error on a GPU.
  for (DivOp div : kernel.getOps<DivOp>())
    if (isa<IntegerType>(valueType(div.getResult()).getElementType()))
      return div.emitError("integer division is not lowered (a zero divisor "
                           "would kill the process on a CPU); divide floats");
  WalkResult result = kernel.walk([&](GatherOp gather) {
    Value source = gather.getSource();
    while (auto cast = source.getDefiningOp<CastOp>())
      source = cast.getInput();
    if (!isa<BlockArgument>(source)) {
      gather.emitError("can only gather from a kernel input (possibly cast)");
      return WalkResult::interrupt();
    }
    return WalkResult::advance();
  });
  if (result.wasInterrupted())
    return failure();
  computeLevels();
  return success();
}

Value RowProgramEmitter::pointerAt(Value pointer, Type elementType,
                                   Value offset) {
  Value offset64 = arith::IndexCastOp::create(b, loc, b.getI64Type(), offset);
  return LLVM::GEPOp::create(b, loc, pointer.getType(), elementType, pointer,
                             ValueRange{offset64});
}

/// How `type` is laid out in memory: a mask (i1) one byte per element, as a
/// torch.bool (LLVM would pack a vector of i1 into bits).
static Type memoryType(Type type) {
  if (!getElementTypeOrSelf(type).isInteger(1))
    return type;
  Type byte = IntegerType::get(type.getContext(), 8);
  if (auto vector = dyn_cast<VectorType>(type))
    return vector.clone(byte);
  return byte;
}

unsigned RowProgramEmitter::alignment(Type type) {
  unsigned elementBytes = storageBytes(getElementTypeOrSelf(type));
  auto vector = dyn_cast<VectorType>(type);
  if (!vector || !aligned)
    return elementBytes;
  // The aligned class promises 16-byte aligned pointers and rows.
  return std::min<unsigned>(16, vector.getNumElements() * elementBytes);
}

Value RowProgramEmitter::load(Value pointer, Type type, Value offset,
                              unsigned align, Value predicate) {
  Type stored = memoryType(type);
  Value address = pointerAt(pointer, getElementTypeOrSelf(stored), offset);
  if (!align)
    align = alignment(stored);
  bool predicated = predicate && config.isGPU();
  Value zero = predicated || stored != type
                   ? arith::ConstantOp::create(b, loc, b.getZeroAttr(stored))
                   : Value();
  Value value =
      predicated
          ? predicatedLoad(b, loc, address, 0, predicate, zero, align,
                           /*mayMerge=*/false)
          : LLVM::LoadOp::create(b, loc, stored, address, align).getResult();
  if (stored == type)
    return value;
  return arith::CmpIOp::create(b, loc, arith::CmpIPredicate::ne, value, zero);
}

void RowProgramEmitter::store(Value value, Value pointer, Value offset,
                              unsigned align) {
  Type stored = memoryType(value.getType());
  if (stored != value.getType())
    value = arith::ExtUIOp::create(b, loc, stored, value);
  Value address = pointerAt(pointer, getElementTypeOrSelf(stored), offset);
  LLVM::StoreOp::create(b, loc, value, address,
                        align ? align : alignment(stored));
}

void RowProgramEmitter::bindStage(Value blockBase, Value group,
                                  int64_t groupBytes, bool aloneOnSM) {
  stagedLoads = aloneOnSM ? kStagedLoads : kStagedUnroll;
  stageBase = blockBase;
  groupInBlock = group;
  stageGroupBytes = groupBytes;
  int64_t offset = 0;
  auto region = [&](int64_t chunks, Type elementType) {
    Value pointer = sharedRegion(group, offset);
    offset += sharedRegionBytes(config, chunks, elementType);
    return pointer;
  };
  auto yield = cast<YieldOp>(kernel.getEntryBlock().getTerminator());
  if (config.partialChunks)
    for (auto [index, output] : llvm::enumerate(yield.getValues()))
      if (ReduceOp reduce = columnReductionOf(output)) {
        partialOffsets[index] = offset;
        partialPointers[index] =
            region(config.partialChunks,
                   valueType(reduce.getInput()).getElementType());
      }
  if (config.stagedChunks)
    for (BlockArgument input : rereadFullInputs(kernel))
      stagePointers[input] =
          region(config.stagedChunks, valueType(input).getElementType());
}

Value RowProgramEmitter::sharedRegion(Value group, int64_t offset) {
  Value bytes = arith::AddIOp::create(
      b, loc,
      arith::MulIOp::create(b, loc, group,
                            indexConstant(b, loc, stageGroupBytes)),
      indexConstant(b, loc, offset));
  return pointerAt(stageBase, b.getI8Type(), bytes);
}

/// Where `chunk` of this thread lives in a shared-memory region (in
/// elements): its own slot, whatever its columns, so that no two threads
/// share one.
Value RowProgramEmitter::sharedOffset(const Chunk &chunk) {
  return arith::MulIOp::create(b, loc, chunk.slot,
                               indexConstant(b, loc, config.vectorWidth));
}

Value andConditions(OpBuilder &b, Location loc, Value lhs, Value rhs) {
  if (!lhs)
    return rhs;
  if (!rhs)
    return lhs;
  return arith::AndIOp::create(b, loc, lhs, rhs);
}

/// Vectors in shared memory are aligned to their size, at most 16 bytes
/// (the regions' alignment).
static unsigned sharedAlignment(Type type) {
  auto vector = cast<VectorType>(type);
  return std::min<int64_t>(16, vector.getNumElements() *
                                   storageBytes(vector.getElementType()));
}

/// Loads `chunkInputs` (full or per-column inputs) for every chunk of
/// `chunks` that has not loaded them yet, all before any chunk's work:
/// ptxas does not move a load above a store that may alias it, nor across
/// a branch (libdevice's erf has one), so loads emitted between the work of
/// chunks would each wait a round trip. A full input comes from global
/// memory, or from shared memory where an earlier pass staged it; a staged
/// chunk's first loads are written there after all of them are issued. A
/// thread reads back only the slots it wrote.
void RowProgramEmitter::preloadInputs(MutableArrayRef<Chunk> chunks,
                                      ArrayRef<BlockArgument> chunkInputs) {
  SmallVector<std::tuple<Chunk *, BlockArgument, Value>> toStage;
  for (Chunk &chunk : chunks) {
    // With predicatedLoads, a row past the end (clamped) and, in a row kept
    // on chip, a vector past the row's end load nothing.
    Value loadValid = predicatedLoads && chunk.unrolled ? chunk.valid : Value();
    Value inRow = andConditions(b, loc, loadValid, rowLoadPredicate());
    for (BlockArgument input : chunkInputs) {
      if (chunk.values.contains(input))
        continue;
      ValueType type = valueType(input);
      VectorType vector = chunkType(type.getElementType());
      Value stage = chunk.staged ? stagePointers.lookup(input) : Value();
      Value loaded;
      if (type.getKind() != ValueKind::Full)
        loaded = load(inputs.lookup(input), vector, chunk.base, 0, loadValid);
      else if (stage && inSharedMemory.contains(input))
        loaded =
            load(stage, vector, sharedOffset(chunk), sharedAlignment(vector));
      else
        loaded = load(inputs.lookup(input), vector, flatOffset(row, chunk.base),
                      0, inRow);
      if (stage && !inSharedMemory.contains(input))
        toStage.push_back({&chunk, input, loaded});
      chunk.values[input] = loaded;
    }
  }
  for (auto [chunk, input, loaded] : toStage) {
    store(loaded, stagePointers.lookup(input), sharedOffset(*chunk),
          sharedAlignment(loaded.getType()));
    stagedThisPass.insert(input);
  }
}

/// The full and per-column inputs a pass reads in its chunks: those of its
/// reductions and, for the final pass, of its full and column outputs (not
/// those behind per-row values, which earlier passes reduced).
SmallVector<BlockArgument>
RowProgramEmitter::passInputs(ArrayRef<RowReduction> reductions, bool isFinal) {
  SmallVector<Value> worklist;
  for (const RowReduction &reduction : reductions)
    llvm::append_range(worklist, reduction.op->getOperands());
  if (isFinal) {
    auto yield = cast<YieldOp>(kernel.getEntryBlock().getTerminator());
    for (Value output : yield.getValues()) {
      ValueKind kind = valueType(output).getKind();
      if (kind == ValueKind::Full)
        worklist.push_back(output);
      else if (kind == ValueKind::Col)
        worklist.push_back(columnReductionOf(output).getInput());
    }
  }
  DenseSet<Value> reached;
  while (!worklist.empty()) {
    Value value = worklist.pop_back_val();
    if (!isChunked(valueType(value).getKind()) || !reached.insert(value).second)
      continue;
    if (Operation *op = value.getDefiningOp())
      llvm::append_range(worklist, op->getOperands());
  }
  SmallVector<BlockArgument> found;
  for (BlockArgument arg : kernel.getEntryBlock().getArguments())
    if (reached.contains(arg))
      found.push_back(arg);
  return found;
}

Value RowProgramEmitter::flatOffset(Value rowIndex, Value column) {
  Value rowStart =
      arith::MulIOp::create(b, loc, rowIndex, indexConstant(b, loc, n));
  return arith::AddIOp::create(b, loc, rowStart, column);
}

RowProgramEmitter::Chunk RowProgramEmitter::makeChunk(Value chunkIndex) {
  Chunk chunk;
  // base = (chunk * threads_per_row + lane) * V
  Value slot = arith::AddIOp::create(
      b, loc,
      arith::MulIOp::create(b, loc, chunkIndex,
                            indexConstant(b, loc, config.threadsPerRow)),
      mapping.lane());
  Value base = arith::MulIOp::create(b, loc, slot,
                                     indexConstant(b, loc, config.vectorWidth));
  chunk.slot = slot;
  // Every lane's vector is in the row: all chunks when the row is a whole
  // number of them, or this one when its last lane's is.
  std::optional<int64_t> constantIndex = getConstantIntValue(chunkIndex);
  chunk.unrolled = constantIndex.has_value();
  if (n % (config.threadsPerRow * config.vectorWidth) == 0 ||
      (constantIndex &&
       ((*constantIndex + 1) * config.threadsPerRow) * config.vectorWidth <=
           n)) {
    chunk.base = base;
    return chunk;
  }
  // Out-of-range vectors are masked out of reductions and stores. They
  // read column 0 (always in bounds), except, with `predicatedLoads`, the
  // unrolled chunks of a row on chip, which load nothing: in a streamed
  // loop the predicated loads' registers, zeroed first, made ptxas spill
  // (layer_norm_bwd f32 n = 32000: 20 bytes).
  chunk.valid = arith::CmpIOp::create(b, loc, arith::CmpIPredicate::ult, base,
                                      indexConstant(b, loc, n));
  chunk.base = arith::SelectOp::create(b, loc, chunk.valid, base,
                                       indexConstant(b, loc, 0));
  return chunk;
}

Value RowProgramEmitter::emitElementwise(Operation *op, ValueRange operands,
                                         Type resultType) {
  Type elementType = getElementTypeOrSelf(operands.front().getType());
  bool isFloat = isa<FloatType>(elementType);
  auto splat = [&](TypedAttr attr) -> Value {
    Type type = operands.front().getType();
    if (auto vector = dyn_cast<VectorType>(type))
      return arith::ConstantOp::create(b, loc,
                                       SplatElementsAttr::get(vector, attr));
    return arith::ConstantOp::create(b, loc, attr);
  };
  auto perElement = [&](ValueRange args, auto create) -> Value {
    return emitMath(b, loc, args, config.isGPU(), create);
  };
  auto math = [&](auto op) {
    using MathOp = decltype(op);
    return perElement(operands, [&](ValueRange args) -> Value {
      return MathOp::create(b, loc, args);
    });
  };
  auto binary = [&](auto floatOp, auto intOp) -> Value {
    using FloatOp = decltype(floatOp);
    using IntOp = decltype(intOp);
    if (isFloat)
      return FloatOp::create(b, loc, operands[0], operands[1]);
    return IntOp::create(b, loc, operands[0], operands[1]);
  };
  return llvm::TypeSwitch<Operation *, Value>(op)
      .Case([&](AddOp) { return binary(arith::AddFOp(), arith::AddIOp()); })
      .Case([&](SubOp) { return binary(arith::SubFOp(), arith::SubIOp()); })
      .Case([&](MulOp) { return binary(arith::MulFOp(), arith::MulIOp()); })
      .Case([&](DivOp) { return binary(arith::DivFOp(), arith::DivSIOp()); })
      .Case([&](MaximumOp) {
        return binary(arith::MaximumFOp(), arith::MaxSIOp());
      })
      .Case([&](MinimumOp) {
        return binary(arith::MinimumFOp(), arith::MinSIOp());
      })
      .Case([&](PowOp) { return math(math::PowFOp()); })
      .Case([&](FmaOp) { return math(math::FmaOp()); })
      .Case([&](NegOp) -> Value {
        if (isFloat)
          return arith::NegFOp::create(b, loc, operands[0]);
        return arith::SubIOp::create(
            b, loc, splat(IntegerAttr::get(elementType, 0)), operands[0]);
      })
      .Case([&](AbsOp) -> Value {
        if (isFloat)
          return math::AbsFOp::create(b, loc, operands[0]);
        // x < 0 ? 0 - x : x, which LLVM makes its abs: the GPU conversion
        // maps math.absi of i32 to libdevice and leaves i64's unconverted.
        Value negated = arith::SubIOp::create(
            b, loc, splat(IntegerAttr::get(elementType, 0)), operands[0]);
        Value negative = arith::CmpIOp::create(
            b, loc, arith::CmpIPredicate::slt, operands[0],
            splat(IntegerAttr::get(elementType, 0)));
        return arith::SelectOp::create(b, loc, negative, negated, operands[0]);
      })
      .Case([&](ExpOp) { return mathLowering.exp(b, loc, operands[0]); })
      .Case([&](LogOp) { return math(math::LogOp()); })
      .Case([&](SqrtOp) { return math(math::SqrtOp()); })
      .Case([&](RsqrtOp) { return math(math::RsqrtOp()); })
      .Case([&](TanhOp) { return mathLowering.tanh(b, loc, operands[0]); })
      .Case([&](ErfOp) { return math(math::ErfOp()); })
      .Case([&](Log1pOp) { return math(math::Log1pOp()); })
      .Case([&](Expm1Op) { return math(math::ExpM1Op()); })
      .Case([&](SinOp) { return math(math::SinOp()); })
      .Case([&](CosOp) { return math(math::CosOp()); })
      .Case([&](FloorOp) { return math(math::FloorOp()); })
      .Case([&](RoundOp) { return math(math::RoundEvenOp()); })
      .Case([&](SigmoidOp) -> Value {
        // 1 / (1 + exp(-x)): saturates to 0 and 1 without NaN.
        Value one = splat(FloatAttr::get(elementType, 1.0));
        Value negated = arith::NegFOp::create(b, loc, operands[0]);
        Value exp = mathLowering.exp(b, loc, negated);
        return arith::DivFOp::create(b, loc, one,
                                     arith::AddFOp::create(b, loc, one, exp));
      })
      .Case([&](CmpOp cmp) -> Value {
        if (isFloat) {
          arith::CmpFPredicate predicate = [&] {
            switch (cmp.getPredicate()) {
            case CmpPredicate::eq:
              return arith::CmpFPredicate::OEQ;
            case CmpPredicate::ne:
              return arith::CmpFPredicate::UNE;
            case CmpPredicate::lt:
              return arith::CmpFPredicate::OLT;
            case CmpPredicate::le:
              return arith::CmpFPredicate::OLE;
            case CmpPredicate::gt:
              return arith::CmpFPredicate::OGT;
            case CmpPredicate::ge:
              return arith::CmpFPredicate::OGE;
            }
            llvm_unreachable("unknown predicate");
          }();
          return arith::CmpFOp::create(b, loc, predicate, operands[0],
                                       operands[1]);
        }
        // Masks order false < true: unsigned (as signed, true is -1).
        bool mask = getElementTypeOrSelf(operands[0].getType()).isInteger(1);
        arith::CmpIPredicate predicate = [&] {
          switch (cmp.getPredicate()) {
          case CmpPredicate::eq:
            return arith::CmpIPredicate::eq;
          case CmpPredicate::ne:
            return arith::CmpIPredicate::ne;
          case CmpPredicate::lt:
            return mask ? arith::CmpIPredicate::ult : arith::CmpIPredicate::slt;
          case CmpPredicate::le:
            return mask ? arith::CmpIPredicate::ule : arith::CmpIPredicate::sle;
          case CmpPredicate::gt:
            return mask ? arith::CmpIPredicate::ugt : arith::CmpIPredicate::sgt;
          case CmpPredicate::ge:
            return mask ? arith::CmpIPredicate::uge : arith::CmpIPredicate::sge;
          }
          llvm_unreachable("unknown predicate");
        }();
        return arith::CmpIOp::create(b, loc, predicate, operands[0],
                                     operands[1]);
      })
      .Case([&](SelectOp) -> Value {
        return arith::SelectOp::create(b, loc, operands[0], operands[1],
                                       operands[2]);
      })
      .Case([&](CastOp) -> Value {
        return convertElements(b, loc, operands[0], resultType);
      })
      .Default([&](Operation *) -> Value { return {}; });
}

Value RowProgramEmitter::loadGatherSource(Value source, Value column,
                                          Value predicate) {
  if (auto cast = source.getDefiningOp<CastOp>()) {
    Value input = loadGatherSource(cast.getInput(), column, predicate);
    return emitElementwise(cast, input,
                           cast.getResult().getType().getElementType());
  }
  Type elementType = valueType(source).getElementType();
  return load(inputs.lookup(source), elementType, flatOffset(row, column), 0,
              predicate);
}

/// Whether `value` (per row) reaches only per-row outputs, which the row's
/// leader stores: no full or per-column value is computed from it.
static bool reachesOnlyRowOutputs(Value value) {
  SmallVector<Value> worklist = {value};
  DenseSet<Value> seen;
  while (!worklist.empty()) {
    Value current = worklist.pop_back_val();
    if (!seen.insert(current).second)
      continue;
    for (Operation *user : current.getUsers())
      for (Value result : user->getResults()) {
        if (isChunked(valueType(result).getKind()))
          return false;
        worklist.push_back(result);
      }
  }
  return true;
}

Value RowProgramEmitter::emitGather(GatherOp gather) {
  // An index outside [0, n) reads column 0 and yields NaN, never memory out
  // of bounds; the runtime reports such indices to the caller.
  Value index = rowValues.lookup(gather.getIndex());
  Type indexType = index.getType();
  Value zero =
      arith::ConstantOp::create(b, loc, IntegerAttr::get(indexType, 0));
  Value size =
      arith::ConstantOp::create(b, loc, IntegerAttr::get(indexType, n));
  Value inRange = arith::AndIOp::create(
      b, loc,
      arith::CmpIOp::create(b, loc, arith::CmpIPredicate::sge, index, zero),
      arith::CmpIOp::create(b, loc, arith::CmpIPredicate::slt, index, size));
  Value safe = arith::SelectOp::create(b, loc, inRange, index, zero);
  Value column = arith::IndexCastOp::create(b, loc, b.getIndexType(), safe);
  // Where only per-row outputs use it, the row's leader alone loads it (every
  // thread of a row asked for the same element: 4 bytes each, 6% of a row
  // of 4096 f32 logits in cross_entropy_fwd).
  Value leaderLoads =
      reachesOnlyRowOutputs(gather.getResult())
          ? andConditions(b, loc, mapping.isRowLeader(b, loc), rowValid)
          : Value();
  Value value = loadGatherSource(gather.getSource(), column, leaderLoads);
  Type type = value.getType();
  TypedAttr poison =
      isa<FloatType>(type)
          ? TypedAttr(FloatAttr::get(
                type,
                APFloat::getNaN(cast<FloatType>(type).getFloatSemantics())))
          : TypedAttr(IntegerAttr::get(type, 0));
  return arith::SelectOp::create(b, loc, inRange, value,
                                 arith::ConstantOp::create(b, loc, poison));
}

LogicalResult RowProgramEmitter::emitRowScopeOps(int level) {
  for (Operation &op : kernel.getEntryBlock().without_terminator()) {
    if (op.getNumResults() != 1 || levels.lookup(op.getResult(0)) != level)
      continue;
    Value result = op.getResult(0);
    ValueType type = valueType(result);
    if (isChunked(type.getKind()) || isa<ReduceOp, ArgReduceOp>(op))
      continue;
    Value lowered;
    if (auto constant = dyn_cast<ConstantOp>(op))
      lowered = arith::ConstantOp::create(b, loc, constant.getValue());
    else if (auto broadcast = dyn_cast<BroadcastOp>(op))
      lowered = rowValues.lookup(broadcast.getInput()); // scalar -> row
    else if (auto gather = dyn_cast<GatherOp>(op))
      lowered = emitGather(gather);
    else {
      SmallVector<Value> operands;
      for (Value operand : op.getOperands())
        operands.push_back(rowValues.lookup(operand));
      lowered = emitElementwise(&op, operands, type.getElementType());
    }
    if (!lowered)
      return op.emitError("cannot lower ")
             << op.getName() << " on per-row values";
    rowValues[result] = lowered;
  }
  return success();
}

Value RowProgramEmitter::emitInChunk(Chunk &chunk, Value value) {
  ValueType type = valueType(value);
  if (!isChunked(type.getKind()))
    return rowValues.lookup(value);
  if (Value known = chunk.values.lookup(value))
    return known;
  if (auto arg = dyn_cast<BlockArgument>(value)) {
    preloadInputs(chunk, arg);
    return chunk.values.lookup(value);
  }
  Value lowered;
  Operation *op = value.getDefiningOp();
  if (auto constant = dyn_cast<ConstantOp>(op)) {
    lowered = arith::ConstantOp::create(
        b, loc,
        SplatElementsAttr::get(chunkType(type.getElementType()),
                               constant.getValue()));
  } else if (auto broadcast = dyn_cast<BroadcastOp>(op)) {
    ValueKind from = valueType(broadcast.getInput()).getKind();
    Value input = emitInChunk(chunk, broadcast.getInput());
    lowered = isChunked(from)
                  ? input
                  : vector::BroadcastOp::create(
                        b, loc, chunkType(type.getElementType()), input)
                        .getResult();
  } else if (auto iota = dyn_cast<IotaOp>(op)) {
    Type elementType = type.getElementType();
    SmallVector<Attribute> steps;
    for (int64_t i = 0; i < config.vectorWidth; ++i)
      steps.push_back(IntegerAttr::get(elementType, i));
    VectorType vector = chunkType(elementType);
    Value base = arith::IndexCastOp::create(b, loc, elementType, chunk.base);
    lowered = arith::AddIOp::create(
        b, loc, vector::BroadcastOp::create(b, loc, vector, base),
        arith::ConstantOp::create(b, loc,
                                  DenseElementsAttr::get(vector, steps)));
  } else {
    SmallVector<Value> operands;
    for (Value operand : op->getOperands())
      operands.push_back(emitInChunk(chunk, operand));
    lowered = emitElementwise(op, operands, chunkType(type.getElementType()));
  }
  chunk.values[value] = lowered;
  return lowered;
}

/// Whether a thread folds `reduction` into a one-lane state, each chunk
/// reduced across its lanes first: an online softmax always
/// (accumulateMaxSumExp), a plain reduction in a streamed pass with one
/// (plainsOnOneLane).
bool RowProgramEmitter::foldsToOneLane(const RowReduction &reduction) const {
  return reduction.form == RowReduction::Form::MaxSumExp ||
         reduction.form == RowReduction::Form::MaxDeviation ||
         reduction.form == RowReduction::Form::Moments ||
         (reduction.form == RowReduction::Form::Plain && plainsOnOneLane);
}

ReductionState RowProgramEmitter::identityState(const RowReduction &reduction) {
  return identityState(reduction,
                       foldsToOneLane(reduction) ? 1 : config.vectorWidth);
}

/// The identity state of `reduction` over `lanes` lanes: the neutral value
/// (and, for an arg reduction, a column past every real one).
ReductionState RowProgramEmitter::identityState(const RowReduction &reduction,
                                                int64_t lanes) {
  Type elementType = valueType(reduction.input).getElementType();
  VectorType stateType = VectorType::get({lanes}, elementType);
  auto splat = [&](TypedAttr value) -> Value {
    return arith::ConstantOp::create(b, loc,
                                     SplatElementsAttr::get(stateType, value));
  };
  auto splatFloat = [&](double value) {
    return splat(FloatAttr::get(elementType, value));
  };
  if (reduction.form == RowReduction::Form::MaxSumExp)
    return {splatFloat(-std::numeric_limits<double>::infinity()),
            splatFloat(0.0)};
  if (reduction.form == RowReduction::Form::MaxDeviation)
    return {splatFloat(-std::numeric_limits<double>::infinity()),
            splatFloat(0.0), splatFloat(0.0)};
  if (reduction.form == RowReduction::Form::Moments)
    return {splatFloat(0.0), splatFloat(0.0), splatFloat(0.0), splatFloat(0.0)};
  ReductionState state = {
      splat(reductionIdentity(reduction.kind, elementType))};
  if (reduction.isArg())
    state.push_back(arith::ConstantOp::create(
        b, loc,
        SplatElementsAttr::get(
            VectorType::get({lanes}, b.getI32Type()),
            b.getI32IntegerAttr(std::numeric_limits<int32_t>::max()))));
  return state;
}

/// This chunk's contribution to a plain or arg `reduction`, or the values
/// an online softmax or the moments' sum folds (accumulateChunk folds the
/// rest of the moments in place); masked lanes hold the identity.
ReductionState RowProgramEmitter::chunkState(Chunk &chunk,
                                             const RowReduction &reduction) {
  ReductionState state = {emitInChunk(chunk, reduction.input)};
  if (reduction.isArg()) {
    // The columns of this chunk's lanes, base + [0, V).
    VectorType columns = chunkType(b.getI32Type());
    SmallVector<int32_t> steps(config.vectorWidth);
    std::iota(steps.begin(), steps.end(), 0);
    Value base = arith::IndexCastOp::create(b, loc, b.getI32Type(), chunk.base);
    state.push_back(arith::AddIOp::create(
        b, loc, vector::BroadcastOp::create(b, loc, columns, base),
        arith::ConstantOp::create(
            b, loc, DenseElementsAttr::get(columns, ArrayRef(steps)))));
  }
  if (chunk.valid) {
    ReductionState identity = identityState(reduction, config.vectorWidth);
    for (auto [value, neutral] : llvm::zip(state, identity))
      value = arith::SelectOp::create(b, loc, chunk.valid, value, neutral);
  }
  return state;
}

/// `lane` (a one-lane state) with `terms`' lanes combined into it by
/// `kind`: a float sum as a tree (reassoc), then the running total.
Value RowProgramEmitter::foldIntoLane(vector::CombiningKind kind, Value terms,
                                      Value lane) {
  bool isFloat = isa<FloatType>(getElementTypeOrSelf(terms.getType()));
  Value total = vector::ReductionOp::create(
      b, loc, kind, terms, vector::ExtractOp::create(b, loc, lane, 0),
      isFloat ? arith::FastMathFlags::reassoc : arith::FastMathFlags::none);
  return vector::BroadcastOp::create(b, loc, lane.getType(), total);
}

/// `accumulator` with this chunk's elements folded in.
ReductionState RowProgramEmitter::accumulateChunk(Chunk &chunk,
                                                  const RowReduction &reduction,
                                                  ArrayRef<Value> accumulator) {
  if (reduction.form == RowReduction::Form::MaxSumExp)
    return accumulateMaxSumExp(chunk, reduction, accumulator);
  if (reduction.form == RowReduction::Form::MaxDeviation)
    return accumulateMaxDeviation(chunk, reduction, accumulator);
  if (reduction.form == RowReduction::Form::Moments)
    return accumulateMoments(chunk, reduction, accumulator);
  if (foldsToOneLane(reduction))
    return {
        foldIntoLane(vectorCombiningKind(reduction.kind,
                                         valueType(reduction.input).isFloat()),
                     chunkState(chunk, reduction)[0], accumulator[0])};
  return combineStates(b, loc, reduction, accumulator,
                       chunkState(chunk, reduction), mathLowering);
}

/// Chan's merge of the chunk into the thread's one-lane moments: the
/// chunk's shifted values reduced two-pass in registers (their mean, then
/// their squared deviations from it), one division a chunk. (Welford's
/// update of each lane took seven operations an element, and a reciprocal
/// and three selects a lane a chunk.) The mean adds the values divided by
/// the width (exact: a power of two), which keeps values near the type's
/// largest from overflowing in the sum (rows in [1e38, 3e38] had a NaN
/// mean). The chunk's valid values join the one-lane sum.
ReductionState RowProgramEmitter::accumulateMoments(
    Chunk &chunk, const RowReduction &reduction, ArrayRef<Value> accumulator) {
  Value sum = foldIntoLane(vector::CombiningKind::ADD,
                           chunkState(chunk, reduction)[0], accumulator[3]);
  Value x = arith::SubFOp::create(b, loc, emitInChunk(chunk, reduction.input),
                                  momentShifts.lookup(reduction.op));
  // Folded from -0.0, which adds nothing (from 0.0, an add stayed).
  Value nothing = floatConstant(b, loc, sum, -0.0);
  auto total = [&](Value terms) {
    return foldIntoLane(vector::CombiningKind::ADD, terms, nothing);
  };
  Value mean = total(arith::MulFOp::create(
      b, loc, x, floatConstant(b, loc, x, 1.0 / config.vectorWidth)));
  Value deviations = arith::SubFOp::create(
      b, loc, x, vector::BroadcastOp::create(b, loc, x.getType(), mean));
  Value m2 = total(arith::MulFOp::create(b, loc, deviations, deviations));
  ReductionState state = combineMoments(
      b, loc, {accumulator[0], accumulator[1], accumulator[2], sum},
      {floatConstant(b, loc, sum, double(config.vectorWidth)), mean, m2,
       nothing});
  if (chunk.valid)
    for (auto [value, old] :
         llvm::zip(MutableArrayRef<Value>(state).take_front(3),
                   accumulator.take_front(3)))
      value = arith::SelectOp::create(b, loc, chunk.valid, value, old);
  return state;
}

/// Online softmax a chunk at a time into a one-lane state: the chunk's max
/// joins the running max, the running sum is rescaled by one exp when the
/// max grows, and the chunk's exp(x - max) are summed into it (an exp per
/// element; merging each element's (x, 1) state into per-lane states cost an
/// exp, a min, two compares and three selects per element, and 16 registers
/// of state). A max of -inf (only -inf so far) shifts by 0, which keeps
/// -inf - -inf out; a NaN propagates through the max into the sum.
ReductionState RowProgramEmitter::accumulateMaxSumExp(
    Chunk &chunk, const RowReduction &reduction, ArrayRef<Value> accumulator) {
  Value x = chunkState(chunk, reduction)[0];
  Value chunkMax =
      vector::ReductionOp::create(b, loc, vector::CombiningKind::MAXIMUMF, x);
  Value oldMax = vector::ExtractOp::create(b, loc, accumulator[0], 0);
  Value max = arith::MaximumFOp::create(b, loc, oldMax, chunkMax);
  Value shift = runningCenter(b, loc, max);
  Value scale =
      mathLowering.exp(b, loc, arith::SubFOp::create(b, loc, oldMax, shift));
  Value terms = mathLowering.exp(
      b, loc,
      arith::SubFOp::create(
          b, loc, x, vector::BroadcastOp::create(b, loc, x.getType(), shift)));
  // The chunk's terms summed as a tree (reassoc), then the rescaled sum.
  Value sum = vector::ReductionOp::create(
      b, loc, vector::CombiningKind::ADD, terms,
      arith::MulFOp::create(
          b, loc, vector::ExtractOp::create(b, loc, accumulator[1], 0), scale),
      arith::FastMathFlags::reassoc);
  auto single = [&](Value scalar) -> Value {
    return vector::BroadcastOp::create(b, loc, accumulator[0].getType(),
                                       scalar);
  };
  return {single(max), single(sum)};
}

/// A chunk into a one-lane max-deviation state: the chunk's max joins the
/// running max (the sum so far moved to it, deviationShift), and the
/// chunk's w * (x - max) and w join the sums. Lanes past the row add
/// nothing (0 * (x - max) could be NaN there).
ReductionState RowProgramEmitter::accumulateMaxDeviation(
    Chunk &chunk, const RowReduction &reduction, ArrayRef<Value> accumulator) {
  Value x = chunkState(chunk, reduction)[0];
  Value w = emitInChunk(chunk, reduction.weight);
  Value oldMax = vector::ExtractOp::create(b, loc, accumulator[0], 0);
  Value oldWeights = vector::ExtractOp::create(b, loc, accumulator[1], 0);
  Value max = arith::MaximumFOp::create(
      b, loc, oldMax,
      vector::ReductionOp::create(b, loc, vector::CombiningKind::MAXIMUMF, x));
  Value center = runningCenter(b, loc, max);
  Value terms = arith::MulFOp::create(
      b, loc, w,
      arith::SubFOp::create(
          b, loc, x, vector::BroadcastOp::create(b, loc, x.getType(), center)));
  Value zeros = floatConstant(b, loc, terms, 0.0);
  if (chunk.valid) {
    terms = arith::SelectOp::create(b, loc, chunk.valid, terms, zeros);
    w = arith::SelectOp::create(b, loc, chunk.valid, w, zeros);
  }
  Value moved = arith::SubFOp::create(
      b, loc, vector::ExtractOp::create(b, loc, accumulator[2], 0),
      deviationShift(b, loc, oldMax, max, oldWeights));
  // The chunk's terms and weights summed as trees (reassoc), then the
  // running sums.
  Value deviation =
      vector::ReductionOp::create(b, loc, vector::CombiningKind::ADD, terms,
                                  moved, arith::FastMathFlags::reassoc);
  Value weights =
      vector::ReductionOp::create(b, loc, vector::CombiningKind::ADD, w,
                                  oldWeights, arith::FastMathFlags::reassoc);
  auto single = [&](Value scalar) -> Value {
    return vector::BroadcastOp::create(b, loc, accumulator[0].getType(),
                                       scalar);
  };
  return {single(max), single(weights), single(deviation)};
}

void RowProgramEmitter::emitChunkWork(
    Chunk &chunk, bool isFinal, ArrayRef<RowReduction> reductions,
    SmallVectorImpl<ReductionState> &accumulators) {
  shareRunningMaxes(reductions, accumulators);
  for (auto [reduction, accumulator] : llvm::zip(reductions, accumulators))
    accumulator = accumulateChunk(chunk, reduction, accumulator);
  if (!isFinal)
    return;
  auto yield = cast<YieldOp>(kernel.getEntryBlock().getTerminator());
  Value storeCondition = andConditions(b, loc, chunk.valid, rowValid);
  for (auto [index, output] : llvm::enumerate(yield.getValues())) {
    ValueKind kind = valueType(output).getKind();
    if (kind == ValueKind::Full) {
      Value value = emitInChunk(chunk, output);
      Value offset = flatOffset(row, chunk.base);
      emitGuarded(b, loc, storeCondition,
                  [&] { store(value, outputs.lookup(index), offset); });
    } else if (kind == ValueKind::Col) {
      // Accumulate into this row group's partials: on chip, or its row of
      // the global partials.
      ReduceOp reduce = columnReductionOf(output);
      Value value = emitInChunk(chunk, reduce.getInput());
      Value partials =
          chunk.partialOnChip ? partialPointers.lookup(index) : Value();
      Value offset =
          partials ? sharedOffset(chunk) : flatOffset(rowGroup, chunk.base);
      unsigned align = partials ? sharedAlignment(value.getType()) : 0;
      if (!partials)
        partials = outputs.lookup(index);
      emitGuarded(b, loc, storeCondition, [&] {
        Value old = load(partials, value.getType(), offset, align);
        store(combineReduction(b, loc, reduce.getKind(), old, value), partials,
              offset, align);
      });
    }
  }
}

/// The lanes of a thread's vector state combined into one scalar state.
ReductionState RowProgramEmitter::reduceLanes(const RowReduction &reduction,
                                              ArrayRef<Value> state) {
  if (foldsToOneLane(reduction)) {
    ReductionState scalar;
    for (Value value : state)
      scalar.push_back(vector::ExtractOp::create(b, loc, value, 0));
    return scalar;
  }
  if (reduction.form == RowReduction::Form::Plain) {
    bool isFloat = valueType(reduction.input).isFloat();
    return {vector::ReductionOp::create(
        b, loc, vectorCombiningKind(reduction.kind, isFloat), state[0])};
  }
  // No vector form (arg reductions): lane by lane.
  ReductionState scalar;
  for (int64_t lane = 0; lane < config.vectorWidth; ++lane) {
    ReductionState laneState;
    for (Value value : state)
      laneState.push_back(vector::ExtractOp::create(b, loc, value, lane));
    scalar = lane == 0 ? laneState
                       : combineStates(b, loc, reduction, scalar, laneState,
                                       mathLowering);
  }
  return scalar;
}

LogicalResult RowProgramEmitter::emitPass(int level, bool isFinal,
                                          ArrayRef<RowReduction> reductions) {
  // Moments accumulate x - x[row, 0]: their running mean then stays
  // near zero and keeps its digits when the row's mean is large against
  // its spread (a mean of 1e4 with unit spread lost 1e-4 of the variance).
  for (const RowReduction &reduction : reductions) {
    if (reduction.form != RowReduction::Form::Moments)
      continue;
    Chunk first;
    first.base = indexConstant(b, loc, 0);
    Value head = emitInChunk(first, reduction.input);
    momentShifts[reduction.op] = vector::BroadcastOp::create(
        b, loc, head.getType(), vector::ExtractOp::create(b, loc, head, 0));
  }
  // Beside a streamed online softmax, a plain reduction's vector state cost
  // 16 registers over two block levels and made ptxas spill at 64
  // (cross_entropy_fwd's label-smoothing mean, bf16 n = 128256). Elsewhere
  // it keeps its lanes: one lane let LLVM unroll rms_norm_fwd's streamed
  // loop half as far (51 -> 32 KiB in flight per SM at f32 n = 32000).
  plainsOnOneLane = !config.rowOnChip &&
                    llvm::any_of(reductions, [](const RowReduction &reduction) {
                      return reduction.form == RowReduction::Form::MaxSumExp;
                    });
  SmallVector<ReductionState> accumulators;
  if (config.rowOnChip) {
    for (const RowReduction &reduction : reductions)
      accumulators.push_back(identityState(reduction));
    for (Chunk &chunk : onChipChunks)
      emitChunkWork(chunk, isFinal, reductions, accumulators);
  } else {
    // Streamed: the staged chunks (from shared memory once a pass staged
    // them), then the rest of the row (from global memory every pass); the
    // final pass also splits where the column partials leave shared memory.
    stagedThisPass.clear();
    SmallVector<int64_t> bounds = {0, config.stagedChunks, config.chunks};
    if (isFinal)
      bounds.push_back(config.partialChunks);
    llvm::sort(bounds);
    bounds.erase(llvm::unique(bounds), bounds.end());
    for (auto [first, end] : llvm::zip(bounds, llvm::drop_begin(bounds)))
      streamChunks(first, end - first, first < config.stagedChunks, reductions,
                   isFinal, accumulators);
    inSharedMemory.insert(stagedThisPass.begin(), stagedThisPass.end());
  }

  if (reductions.empty())
    return success();
  SmallVector<ReductionState> partials;
  for (auto [reduction, accumulator] : llvm::zip(reductions, accumulators))
    partials.push_back(reduceLanes(reduction, accumulator));
  SmallVector<ReductionState> results =
      mapping.combineAcrossRow(b, loc, reductions, partials);
  auto divideByN = [&](Value value) -> Value {
    return arith::DivFOp::create(b, loc, value,
                                 floatConstant(b, loc, value, double(n)));
  };
  for (auto [reduction, state] : llvm::zip(reductions, results)) {
    Operation *op = reduction.op;
    switch (reduction.form) {
    case RowReduction::Form::Plain:
      rowValues[op->getResult(0)] =
          reduction.kind == ReduceKind::Mean ? divideByN(state[0]) : state[0];
      break;
    case RowReduction::Form::Arg: {
      Type type = valueType(op->getResult(0)).getElementType();
      Value column = state[1];
      if (type != column.getType())
        column = arith::ExtSIOp::create(b, loc, type, column);
      rowValues[op->getResult(0)] = column;
      break;
    }
    case RowReduction::Form::MaxSumExp:
    case RowReduction::Form::MaxDeviation: {
      // As two passes give: x - max is NaN somewhere when the max is +inf
      // or -inf (a NaN max already made the sum NaN).
      Value max = state[0];
      Value infinite = arith::CmpFOp::create(
          b, loc, arith::CmpFPredicate::OEQ, math::AbsFOp::create(b, loc, max),
          floatConstant(b, loc, max, std::numeric_limits<double>::infinity()));
      rowValues[op->getResult(0)] = max;
      rowValues[op->getResult(1)] = arith::SelectOp::create(
          b, loc, infinite,
          floatConstant(b, loc, max, std::numeric_limits<double>::quiet_NaN()),
          state.back());
      if (reduction.form == RowReduction::Form::MaxDeviation)
        rowValues[op->getResult(2)] = state[1];
      break;
    }
    case RowReduction::Form::Moments: {
      // Two estimates of the mean: the sum / n, rounded at the size of the
      // values, and the shift plus the moments' shifted mean, rounded at
      // the size of x - x[row, 0] but in every merge of a chunk's or a
      // thread's state (mean-zero rows of 32000 whose first element is
      // their mean: up to 27 ulps of the mean against 3 for PyTorch). The
      // sum is taken unless the mean is at least kShiftedMeanMargin times
      // the shifted mean plus the spread: 1e3 + 0.1 randn, where the sum
      // rounds at the size of n x 1e3. A sum that overflowed to inf, or a
      // NaN, keeps the shifted mean.
      Value shifted = state[1];
      Value shiftedMean = arith::AddFOp::create(
          b, loc, vector::ExtractOp::create(b, loc, momentShifts.lookup(op), 0),
          shifted);
      Value sumMean = divideByN(state[3]);
      Value variance = divideByN(state[2]);
      // Sequenced: as two arguments of one call, the compilers that build
      // tilefuse emitted the sizes in either order.
      Value shiftedSize = math::AbsFOp::create(b, loc, shifted);
      Value spread = math::SqrtOp::create(b, loc, variance);
      Value sumSize = math::AbsFOp::create(b, loc, sumMean);
      Value bound = arith::MulFOp::create(
          b, loc, arith::AddFOp::create(b, loc, shiftedSize, spread),
          floatConstant(b, loc, spread, kShiftedMeanMargin));
      Value takeSum = arith::CmpFOp::create(b, loc, arith::CmpFPredicate::OLT,
                                            sumSize, bound);
      rowValues[op->getResult(0)] =
          arith::SelectOp::create(b, loc, takeSum, sumMean, shiftedMean);
      rowValues[op->getResult(1)] =
          reduction.kind == ReduceKind::Mean ? variance : state[2];
      break;
    }
    }
  }
  return success();
}

/// Folds chunks [first, first + count) of a streamed row into
/// `accumulators` (which hold chunks [0, first)): each thread folds its
/// chunks in blocks (accuracy over long rows); a pass without reductions is
/// one plain loop. The loops carry every state's values, flattened in order.
/// On a GPU a thread keeps a group of chunks' loads in flight: a pass that
/// stores takes a group per iteration and issues all its loads before their
/// work (preloadInputs; the last count % group chunks make one group
/// more); in a pass that only loads, the innermost loop is unrolled.
void RowProgramEmitter::streamChunks(
    int64_t first, int64_t count, bool staged,
    ArrayRef<RowReduction> reductions, bool isFinal,
    SmallVectorImpl<ReductionState> &accumulators) {
  auto unflatten = [&](ValueRange flat) {
    SmallVector<ReductionState> states;
    for (const RowReduction &reduction : reductions) {
      states.emplace_back(flat.take_front(reduction.stateSize()));
      flat = flat.drop_front(reduction.stateSize());
    }
    return states;
  };
  auto flatten = [](ArrayRef<ReductionState> states) {
    SmallVector<Value> flat;
    for (const ReductionState &state : states)
      flat.append(state.begin(), state.end());
    return flat;
  };
  auto combine = [&](ArrayRef<ReductionState> lhsStates,
                     ArrayRef<ReductionState> rhsStates) {
    SmallVector<ReductionState> lhs(lhsStates), rhs(rhsStates);
    shareRunningMaxes(reductions, lhs);
    shareRunningMaxes(reductions, rhs);
    SmallVector<ReductionState> combined;
    for (auto [reduction, left, right] : llvm::zip(reductions, lhs, rhs))
      combined.push_back(
          combineStates(b, loc, reduction, left, right, mathLowering));
    return combined;
  };
  // Groups of kStreamGroup chunks for a pass that stores outputs (its
  // stores held back the next chunk's loads: geglu_fwd bf16, n = 4096, kept
  // 20 KiB in flight per SM), of kMergedPassGroup for a merged reduction's
  // pass that does not (the model put it latency-bound). Plain reduction
  // passes gained nothing and spilled (rms_norm_fwd bf16, n = 262144: 24
  // bytes). Staged chunks take bigger groups: their later passes read
  // shared memory, and their register budget is the whole SM's. The pass
  // that stores a row's outputs after earlier passes reduced it takes
  // kFinalPassGroup (cross_entropy_fwd_grad bf16, n = 262144: 19 -> 24 KiB
  // in flight per SM); 4 everywhere made elementwise kernels spill
  // (adamw_step bf16, n = 128256: 124 bytes).
  bool merged = llvm::any_of(reductions, [](const RowReduction &reduction) {
    return reduction.form == RowReduction::Form::MaxSumExp ||
           reduction.form == RowReduction::Form::MaxDeviation ||
           reduction.form == RowReduction::Form::Moments;
  });
  bool stores = storesOutputs(isFinal);
  bool afterReductions = isFinal && finalLevel > 0 && reductions.empty();
  // Where only the first chunks' column partials fit in shared memory, the
  // final pass over those takes kStreamGroup: kFinalPassGroup made ptxas
  // spill 12-80 bytes (layer_norm_bwd bf16 n >= 32000, sm_90); one chunk
  // at a time spills nothing on sm_80/sm_86 either (kStreamGroup: 4-8
  // bytes there) but is latency-bound in the model (layer_norm_bwd bf16
  // n = 32000: 50% -> 40%).
  bool partlyOnChip = isFinal && first < config.partialChunks &&
                      config.partialChunks < config.chunks;
  SmallVector<BlockArgument> reread = rereadFullInputs(kernel);
  int64_t fullInputs = std::max<int64_t>(1, reread.size());
  bool wholeRowStaged = config.stagedChunks == config.chunks;
  int64_t group = !config.isGPU() ? 1
                  : staged && wholeRowStaged
                      ? std::max(kStagedUnroll, stagedLoads / fullInputs)
                  : staged                                     ? kStagedUnroll
                  : stores && afterReductions && !partlyOnChip ? kFinalPassGroup
                  : stores || partlyOnChip                     ? kStreamGroup
                  : merged ? kMergedPassGroup
                           : 1;
  // Only a pass that stores (its outputs, or the chunks it stages) needs
  // its loads first. A pass that only loads has its innermost loop unrolled
  // instead, which keeps its blocks of chunks (a group per iteration made
  // ptxas spill 4 bytes in cross_entropy_fwd bf16, n = 128256).
  bool staging = staged && !llvm::all_of(reread, [&](Value input) {
                   return inSharedMemory.contains(input);
                 });
  bool preload = stores || staging;
  SmallVector<BlockArgument> chunkInputs;
  if (preload)
    chunkInputs = passInputs(reductions, isFinal);
  // A pass that stages holds every vector it loads until its shared-memory
  // stores: stagedLoads vectors a group, whatever the inputs
  // (kStagedUnroll past kStagedLoadsMaxChunks chunks).
  if (staging)
    group = std::max<int64_t>(
        1,
        (config.chunks <= kStagedLoadsMaxChunks ? stagedLoads : kStagedUnroll) /
            std::max<int64_t>(1, chunkInputs.size()));
  SmallVector<ReductionState> identities;
  for (const RowReduction &reduction : reductions)
    identities.push_back(identityState(reduction));
  // Folds `terms` groups of `size` chunks from chunk `start` on.
  auto fold = [&](int64_t start, int64_t terms, int64_t size) {
    return unflatten(emitBlockedAccumulation(
        b, loc, indexConstant(b, loc, terms), reductions.empty() ? 1 : terms,
        flatten(identities),
        [&](Value index, ValueRange carried) {
          if (!preload && group > 1)
            b.getInsertionBlock()->getParentOp()->setAttr(
                kStreamLoopAttr, b.getI64IntegerAttr(group));
          SmallVector<Chunk> chunks;
          for (int64_t member = 0; member < size; ++member)
            chunks.push_back(makeChunk(arith::AddIOp::create(
                b, loc,
                arith::MulIOp::create(b, loc, index,
                                      indexConstant(b, loc, size)),
                indexConstant(b, loc, start + member))));
          for (Chunk &chunk : chunks) {
            chunk.staged = staged;
            chunk.partialOnChip = first < config.partialChunks;
          }
          if (preload)
            preloadInputs(chunks, chunkInputs);
          SmallVector<ReductionState> states = unflatten(carried);
          for (Chunk &chunk : chunks)
            emitChunkWork(chunk, isFinal, reductions, states);
          return flatten(states);
        },
        [&](ValueRange lhs, ValueRange rhs) {
          return flatten(combine(unflatten(lhs), unflatten(rhs)));
        }));
  };
  int64_t size = preload ? group : 1;
  int64_t groups = count / size, rest = count % size;
  auto append = [&](SmallVector<ReductionState> folded) {
    if (!accumulators.empty())
      folded = combine(accumulators, folded);
    accumulators.assign(folded.begin(), folded.end());
  };
  if (groups)
    append(fold(first, groups, size));
  // The last count % size chunks keep their loads in flight together, one
  // group more (one at a time, each was a round trip of its own:
  // layer_norm_fwd bf16 n = 128256 77% -> 89% of HBM in the traffic
  // model), but in a pass that read-modify-writes column partials
  // (rms_norm_bwd bf16 n = 32000 spilled 20 bytes on sm_90).
  bool writesPartials = isFinal && hasColumnReduction;
  preloaded |= size > 1 && (groups || (rest > 1 && !writesPartials));
  if (rest)
    append(writesPartials ? fold(first + groups * size, rest, 1)
                          : fold(first + groups * size, 1, rest));
}

void RowProgramEmitter::forEachChunk(int64_t first, int64_t end,
                                     function_ref<void(Chunk &)> body) {
  if (first == end)
    return;
  auto loop =
      scf::ForOp::create(b, loc, indexConstant(b, loc, first),
                         indexConstant(b, loc, end), indexConstant(b, loc, 1));
  OpBuilder::InsertionGuard insertion(b);
  b.setInsertionPointToStart(loop.getBody());
  Chunk chunk = makeChunk(loop.getInductionVar());
  body(chunk);
}

void RowProgramEmitter::emitPartialsInit(Value rowGroupIndex) {
  auto yield = cast<YieldOp>(kernel.getEntryBlock().getTerminator());
  for (auto [index, output] : llvm::enumerate(yield.getValues())) {
    ReduceOp reduce = columnReductionOf(output);
    if (!reduce)
      continue;
    Type elementType = valueType(reduce.getInput()).getElementType();
    Value identity = arith::ConstantOp::create(
        b, loc,
        SplatElementsAttr::get(
            chunkType(elementType),
            reductionIdentity(reduce.getKind(), elementType)));
    // The chunks on chip, then those in global memory.
    forEachChunk(0, config.partialChunks, [&](Chunk &chunk) {
      store(identity, partialPointers.lookup(index), sharedOffset(chunk),
            sharedAlignment(identity.getType()));
    });
    // A row group of one thread holds its partials contiguously, and LLVM
    // widens their loads over the region's padding (three f32 partials as
    // one v4 load): that padding must hold what someone wrote.
    int64_t used = config.partialChunks * config.vectorWidth;
    int64_t padded =
        sharedRegionBytes(config, config.partialChunks, elementType) /
        storageBytes(elementType);
    if (config.partialChunks && config.threadsPerRow == 1 && padded > used) {
      Value scalar = arith::ConstantOp::create(
          b, loc, reductionIdentity(reduce.getKind(), elementType));
      for (int64_t element = used; element < padded; ++element)
        store(scalar, partialPointers.lookup(index),
              indexConstant(b, loc, element), 0);
    }
    forEachChunk(config.partialChunks, config.chunks, [&](Chunk &chunk) {
      Value offset = flatOffset(rowGroupIndex, chunk.base);
      emitGuarded(b, loc, chunk.valid,
                  [&] { store(identity, outputs.lookup(index), offset); });
    });
  }
}

void RowProgramEmitter::emitPartialsFlush(Value partialRow, Value groups) {
  if (partialPointers.empty())
    return;
  // The first row group's threads combine every row group's partials on
  // chip once all of them have added their last row (the chunks in global
  // memory are there already).
  bool grouped = config.rowsPerBlock > 1 || foldsResidentBlocks(config);
  if (grouped)
    gpu::BarrierOp::create(b, loc);
  Value isFirstGroup =
      grouped ? arith::CmpIOp::create(b, loc, arith::CmpIPredicate::eq,
                                      groupInBlock, indexConstant(b, loc, 0))
                    .getResult()
              : Value();
  auto yield = cast<YieldOp>(kernel.getEntryBlock().getTerminator());
  emitGuarded(b, loc, isFirstGroup, [&] {
    for (auto [index, output] : llvm::enumerate(yield.getValues())) {
      if (!partialPointers.count(index))
        continue;
      ReduceOp reduce = columnReductionOf(output);
      VectorType type =
          chunkType(valueType(reduce.getInput()).getElementType());
      forEachChunk(0, config.partialChunks, [&](Chunk &chunk) {
        Value slot = sharedOffset(chunk);
        auto partialOf = [&](Value group) {
          return load(sharedRegion(group, partialOffsets.lookup(index)), type,
                      slot, sharedAlignment(type));
        };
        Value total = partialOf(indexConstant(b, loc, 0));
        if (grouped) {
          auto others =
              scf::ForOp::create(b, loc, indexConstant(b, loc, 1), groups,
                                 indexConstant(b, loc, 1), ValueRange{total});
          OpBuilder::InsertionGuard insertion(b);
          b.setInsertionPointToStart(others.getBody());
          scf::YieldOp::create(
              b, loc,
              combineReduction(b, loc, reduce.getKind(),
                               others.getRegionIterArgs()[0],
                               partialOf(others.getInductionVar())));
          total = others.getResult(0);
        }
        Value offset = flatOffset(partialRow, chunk.base);
        emitGuarded(b, loc, chunk.valid,
                    [&] { store(total, outputs.lookup(index), offset); });
      });
    }
  });
}

/// `value` copied through an opaque `mov.b32` per 32 bits: LLVM cannot
/// merge what a later pass computes from the copy with what an earlier
/// pass computed from `value`, which would keep those results live. The
/// copies have side effects so that two passes' copies of one value are
/// not merged either (a pure asm with the same operand would be).
static Value opaqueCopy(OpBuilder &b, Location loc, Value value) {
  if (value.getType().isIndex()) {
    Value word = arith::IndexCastOp::create(b, loc, b.getI32Type(), value);
    Value moved =
        opaqueCopy(b, loc,
                   vector::BroadcastOp::create(
                       b, loc, VectorType::get({1}, b.getI32Type()), word));
    return arith::IndexCastOp::create(
        b, loc, b.getIndexType(), vector::ExtractOp::create(b, loc, moved, 0));
  }
  auto vector = cast<VectorType>(value.getType());
  auto words = VectorType::get(
      {vector.getNumElements() * vector.getElementTypeBitWidth() / 32},
      b.getI32Type());
  Value packed = vector::BitCastOp::create(b, loc, words, value);
  Value copy = packed;
  for (int64_t i = 0; i < words.getNumElements(); ++i) {
    Value word = vector::ExtractOp::create(b, loc, packed, i);
    Value moved =
        LLVM::InlineAsmOp::create(
            b, loc, b.getI32Type(), ValueRange{word}, "mov.b32 $0, $1;", "=r,r",
            /*has_side_effects=*/true, /*is_align_stack=*/false,
            LLVM::tailcallkind::TailCallKind::None,
            LLVM::AsmDialectAttr::get(b.getContext(), LLVM::AsmDialect::AD_ATT),
            /*operand_attrs=*/ArrayAttr())
            .getResult(0);
    copy = vector::InsertOp::create(b, loc, moved, copy, i);
  }
  return vector::BitCastOp::create(b, loc, vector, copy);
}

void RowProgramEmitter::holdLoadsPacked() {
  if (!loadsHeldPacked)
    return;
  auto isPacked = [](Value loaded) {
    auto vector = dyn_cast<VectorType>(loaded.getType());
    return vector && isa<FloatType>(vector.getElementType()) &&
           vector.getElementTypeBitWidth() == 16 &&
           vector.getNumElements() % 2 == 0;
  };
  // A column index (iota) is derived from the chunk's base, not from a
  // load: copied too, its masks are recomputed rather than held.
  bool usesColumns = false;
  kernel.walk([&](IotaOp) { usesColumns = true; });
  for (Chunk &chunk : onChipChunks) {
    if (usesColumns)
      chunk.base = opaqueCopy(b, loc, chunk.base);
    // In argument order: the copies' order in the PTX must not depend on
    // where the map put them.
    DenseMap<Value, Value> loads;
    for (BlockArgument argument : kernel.getEntryBlock().getArguments())
      if (Value loaded = chunk.values.lookup(argument))
        loads[argument] =
            isPacked(loaded) ? opaqueCopy(b, loc, loaded) : loaded;
    chunk.values = std::move(loads);
  }
}

LogicalResult RowProgramEmitter::emitRow(Value rowIndex, Value valid,
                                         Value group) {
  row = rowIndex;
  rowValid = valid;
  rowGroup = group;
  rowValues.clear();
  onChipChunks.clear();
  inSharedMemory.clear(); // each row stages its own chunks
  for (BlockArgument arg : kernel.getEntryBlock().getArguments()) {
    ValueType type = valueType(arg);
    if (type.getKind() == ValueKind::Scalar)
      rowValues[arg] = inputs.lookup(arg);
    else if (type.getKind() == ValueKind::Row)
      rowValues[arg] = load(inputs.lookup(arg), type.getElementType(), row, 0,
                            rowLoadPredicate());
  }
  if (config.rowOnChip)
    for (int64_t c = 0; c < config.chunks; ++c) {
      onChipChunks.push_back(makeChunk(indexConstant(b, loc, c)));
      onChipChunks.back().partialOnChip = c < config.partialChunks;
    }
  if (!columnsLoadedWithRow.empty())
    preloadInputs(onChipChunks, columnsLoadedWithRow);

  int passesDone = 0;
  for (int level = 0; level <= maxLevel; ++level) {
    if (failed(emitRowScopeOps(level)))
      return failure();
    SmallVector<RowReduction> reductions = rowReductions(kernel, levels, level);
    bool isFinal = level == finalLevel;
    if (!reductions.empty() || isFinal) {
      if (passesDone++ > 0)
        holdLoadsPacked();
      if (failed(emitPass(level, isFinal, reductions)))
        return failure();
    }
  }

  auto yield = cast<YieldOp>(kernel.getEntryBlock().getTerminator());
  Value leader = andConditions(b, loc, mapping.isRowLeader(b, loc), rowValid);
  for (auto [index, output] : llvm::enumerate(yield.getValues())) {
    if (valueType(output).getKind() != ValueKind::Row)
      continue;
    Value value = rowValues.lookup(output);
    emitGuarded(b, loc, leader,
                [&] { store(value, outputs.lookup(index), row); });
  }
  return success();
}

LogicalResult RowProgramEmitter::emitScalarValues() {
  row = indexConstant(b, loc, 0);
  rowValid = rowGroup = Value();
  rowValues.clear();
  for (BlockArgument arg : kernel.getEntryBlock().getArguments())
    if (valueType(arg).getKind() == ValueKind::Scalar)
      rowValues[arg] = inputs.lookup(arg);
  for (int level = 0; level <= maxLevel; ++level)
    if (failed(emitRowScopeOps(level)))
      return failure();
  return success();
}

void RowProgramEmitter::emitElementwiseAt(Value offset) {
  Chunk chunk;
  chunk.base = offset;
  auto yield = cast<YieldOp>(kernel.getEntryBlock().getTerminator());
  for (auto [index, output] : llvm::enumerate(yield.getValues()))
    store(emitInChunk(chunk, output), outputs.lookup(index), offset);
}

} // namespace tilefuse::lowering
