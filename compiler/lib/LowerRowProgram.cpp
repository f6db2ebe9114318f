//===- LowerRowProgram.cpp - fuse kernels to loops, vectors and pointers ---===//
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
// The GPU and the CPU differ only in where rows and lanes come from and in
// how a reduction combines across the threads of a row (RowMapping).
//
//===----------------------------------------------------------------------===//

#include "PredicatedLoad.h"

#include "tilefuse/Compiler/KernelABI.h"
#include "tilefuse/Compiler/Passes.h"
#include "tilefuse/Compiler/TileConfig.h"

#include "mlir/Dialect/LLVMIR/NVVMDialect.h"
#include "mlir/Dialect/SCF/Utils/Utils.h"
#include "mlir/Dialect/Utils/StaticValueUtils.h"
#include "mlir/IR/Builders.h"
#include "mlir/IR/BuiltinTypes.h"
#include "llvm/ADT/StringSwitch.h"
#include "llvm/ADT/TypeSwitch.h"
#include "llvm/Support/MathExtras.h"

#include <functional>
#include <limits>
#include <numeric>

namespace tilefuse {
#define GEN_PASS_DEF_FUSELOWERTOGPU
#define GEN_PASS_DEF_FUSELOWERTOCPU
#include "tilefuse/Compiler/Passes.h.inc"
} // namespace tilefuse

using namespace mlir;
using namespace tilefuse;
using namespace tilefuse::fuse;

namespace {

ValueType valueType(Value value) { return cast<ValueType>(value.getType()); }

bool isChunked(ValueKind kind) {
  return kind == ValueKind::Full || kind == ValueKind::Col;
}

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
    case Form::Plain: return 1;
    case Form::Arg:
    case Form::MaxSumExp: return 2;
    case Form::MaxDeviation: return 3;
    case Form::Moments: return 4;
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
                       MutableArrayRef<ReductionState> states) {
  for (auto [deviation, state] : llvm::zip(reductions, states)) {
    if (deviation.form != RowReduction::Form::MaxDeviation)
      continue;
    for (auto [other, otherState] : llvm::zip(reductions, states))
      if (other.form == RowReduction::Form::MaxSumExp &&
          other.input == deviation.input)
        state[0] = otherState[0];
  }
}

/// The row reductions of `kernel` whose input is available after pass
/// `level` (all of them for level -1), in program order.
SmallVector<RowReduction> rowReductions(KernelOp kernel,
                                        const DenseMap<Value, int> &levels,
                                        int level) {
  SmallVector<RowReduction> reductions;
  for (Operation &op : kernel.getEntryBlock().without_terminator())
    if (std::optional<RowReduction> reduction = RowReduction::of(&op))
      if (level < 0 || reducedLevel(&op, levels) == level)
        reductions.push_back(*reduction);
  return reductions;
}

/// The column reduction an output stores, looking through the cast to the
/// storage dtype that specialization adds; null if there is none.
ReduceOp columnReductionOf(Value output) {
  if (auto cast = output.getDefiningOp<CastOp>())
    output = cast.getInput();
  auto reduce = output.getDefiningOp<ReduceOp>();
  return reduce && !reduce.isRowReduction() ? reduce : ReduceOp();
}

/// The neutral element of a reduction, as an attribute of `type`.
TypedAttr reductionIdentity(ReduceKind kind, Type type) {
  if (auto floatType = dyn_cast<FloatType>(type)) {
    const llvm::fltSemantics &semantics = floatType.getFloatSemantics();
    if (kind == ReduceKind::Max)
      return FloatAttr::get(type, APFloat::getInf(semantics, /*Negative=*/true));
    if (kind == ReduceKind::Min)
      return FloatAttr::get(type, APFloat::getInf(semantics));
    return FloatAttr::get(type, APFloat::getZero(semantics));
  }
  unsigned width = type.getIntOrFloatBitWidth();
  if (kind == ReduceKind::Max)
    return IntegerAttr::get(type, APInt::getSignedMinValue(width));
  if (kind == ReduceKind::Min)
    return IntegerAttr::get(type, APInt::getSignedMaxValue(width));
  return IntegerAttr::get(type, 0);
}

/// Combines two partial results of a reduction (NaN-propagating max/min).
Value combineReduction(OpBuilder &b, Location loc, ReduceKind kind, Value lhs,
                       Value rhs) {
  bool isFloat = isa<FloatType>(getElementTypeOrSelf(lhs.getType()));
  switch (kind) {
  case ReduceKind::Sum:
  case ReduceKind::Mean:
    return isFloat ? arith::AddFOp::create(b, loc, lhs, rhs).getResult()
                   : arith::AddIOp::create(b, loc, lhs, rhs).getResult();
  case ReduceKind::Max:
    return isFloat ? arith::MaximumFOp::create(b, loc, lhs, rhs).getResult()
                   : arith::MaxSIOp::create(b, loc, lhs, rhs).getResult();
  case ReduceKind::Min:
    return isFloat ? arith::MinimumFOp::create(b, loc, lhs, rhs).getResult()
                   : arith::MinSIOp::create(b, loc, lhs, rhs).getResult();
  }
  llvm_unreachable("unknown reduction");
}

/// Combines two (value, column) states of an arg reduction, as scalars or
/// vectors: a NaN beats a number, then the larger (max) or smaller (min)
/// value, then, among equals or NaNs, the lower column.
ReductionState combineArgReduction(OpBuilder &b, Location loc, ReduceKind kind,
                                   ArrayRef<Value> lhs, ArrayRef<Value> rhs) {
  using arith::CmpFPredicate;
  auto cmpf = [&](CmpFPredicate predicate, Value x, Value y) -> Value {
    return arith::CmpFOp::create(b, loc, predicate, x, y);
  };
  Value lhsNaN = cmpf(CmpFPredicate::UNO, lhs[0], lhs[0]);
  Value rhsNaN = cmpf(CmpFPredicate::UNO, rhs[0], rhs[0]);
  Value beats = cmpf(kind == ReduceKind::Max ? CmpFPredicate::OGT
                                             : CmpFPredicate::OLT,
                     rhs[0], lhs[0]);
  Value equal = arith::OrIOp::create(
      b, loc, cmpf(CmpFPredicate::OEQ, rhs[0], lhs[0]),
      arith::AndIOp::create(b, loc, lhsNaN, rhsNaN));
  Value lower = arith::CmpIOp::create(b, loc, arith::CmpIPredicate::slt,
                                      rhs[1], lhs[1]);
  Value onlyRhsNaN = arith::AndIOp::create(
      b, loc, rhsNaN, cmpf(CmpFPredicate::ORD, lhs[0], lhs[0]));
  Value takeRhs = arith::OrIOp::create(
      b, loc, arith::OrIOp::create(b, loc, onlyRhsNaN, beats),
      arith::AndIOp::create(b, loc, equal, lower));
  return {arith::SelectOp::create(b, loc, takeRhs, rhs[0], lhs[0]),
          arith::SelectOp::create(b, loc, takeRhs, rhs[1], lhs[1])};
}

/// `create` applied to `args`. On a GPU a transcendental runs per element
/// (`perElement`): it lowers to scalar instructions or libdevice calls, not
/// to vector forms. On the CPU it stays a vector, for
/// fuse-approximate-math's vector polynomials.
Value emitMath(OpBuilder &b, Location loc, ValueRange args, bool perElement,
               function_ref<Value(ValueRange)> create) {
  auto vector = dyn_cast<VectorType>(args.front().getType());
  if (!vector || !perElement)
    return create(args);
  SmallVector<Value> elements;
  for (int64_t i = 0, e = vector.getNumElements(); i < e; ++i) {
    SmallVector<Value> scalars;
    for (Value arg : args)
      scalars.push_back(vector::ExtractOp::create(b, loc, arg, i));
    elements.push_back(create(scalars));
  }
  return vector::FromElementsOp::create(b, loc, vector, elements);
}

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
Value floatConstant(OpBuilder &b, Location loc, Value like, double value) {
  Type type = like.getType();
  auto attr = FloatAttr::get(getElementTypeOrSelf(type), value);
  if (auto vector = dyn_cast<VectorType>(type))
    return arith::ConstantOp::create(b, loc, SplatElementsAttr::get(vector, attr));
  return arith::ConstantOp::create(b, loc, attr);
}

/// ex2.approx(x * factor) for a scalar f32 x.
Value exp2Scaled(OpBuilder &b, Location loc, Value x, double factor) {
  Value scaled =
      arith::MulFOp::create(b, loc, x, floatConstant(b, loc, x, factor));
  return math::Exp2Op::create(b, loc, scaled);
}

Value MathLowering::exp(OpBuilder &b, Location loc, Value x) const {
  bool cheap = cheapFor(x);
  return emitMath(b, loc, x, perElement, [&](ValueRange args) -> Value {
    if (!cheap)
      return math::ExpOp::create(b, loc, args[0]);
    return exp2Scaled(b, loc, args[0], llvm::numbers::log2e);
  });
}

Value MathLowering::tanh(OpBuilder &b, Location loc, Value x) const {
  bool cheap = cheapFor(x);
  return emitMath(b, loc, x, perElement, [&](ValueRange args) -> Value {
    Value y = args[0];
    if (!cheap)
      return math::TanhOp::create(b, loc, y);
    Value one = floatConstant(b, loc, y, 1.0);
    Value denominator = arith::AddFOp::create(
        b, loc, one, exp2Scaled(b, loc, y, 2 * llvm::numbers::log2e));
    // afn: div.approx (a reciprocal and a multiplication), not div.rn.
    Value quotient = arith::DivFOp::create(
        b, loc, floatConstant(b, loc, y, -2.0), denominator,
        arith::FastMathFlags::afn);
    Value saturating = arith::AddFOp::create(b, loc, one, quotient);
    // Explicit fma: the NVPTX backend contracts nothing here.
    Value square = arith::MulFOp::create(b, loc, y, y);
    Value series = arith::MulFOp::create(
        b, loc, y,
        math::FmaOp::create(b, loc, square,
                            floatConstant(b, loc, y, -1.0 / 3.0), one));
    // x^2 < 1/256 is |x| < 1/16 (false for NaN: the quotient's NaN wins).
    Value nearZero =
        arith::CmpFOp::create(b, loc, arith::CmpFPredicate::OLT, square,
                              floatConstant(b, loc, y, 1.0 / 256));
    return arith::SelectOp::create(b, loc, nearZero, series, saturating);
  });
}

/// Merges two online-softmax states (m, s), s = sum of exp(x - m): the
/// smaller max's sum is rescaled by exp(min - max), one exp per merge. A
/// state whose max is -inf has s = 0 (the guard keeps -inf - -inf out), so
/// -inf elements add nothing; a NaN max makes s NaN.
ReductionState combineMaxSumExp(OpBuilder &b, Location loc,
                                ArrayRef<Value> lhs, ArrayRef<Value> rhs,
                                const MathLowering &lowering) {
  using arith::CmpFPredicate;
  Value max = arith::MaximumFOp::create(b, loc, lhs[0], rhs[0]);
  Value min = arith::MinimumFOp::create(b, loc, lhs[0], rhs[0]);
  Value difference = arith::SubFOp::create(b, loc, min, max);
  Value scale = lowering.exp(b, loc, difference);
  Value negInf = floatConstant(b, loc, max,
                               -std::numeric_limits<double>::infinity());
  Value empty = arith::CmpFOp::create(b, loc, CmpFPredicate::OEQ, max, negInf);
  scale = arith::SelectOp::create(b, loc, empty,
                                  floatConstant(b, loc, max, 0.0), scale);
  Value lhsLarger =
      arith::CmpFOp::create(b, loc, CmpFPredicate::OGE, lhs[0], rhs[0]);
  Value larger = arith::SelectOp::create(b, loc, lhsLarger, lhs[1], rhs[1]);
  Value smaller = arith::SelectOp::create(b, loc, lhsLarger, rhs[1], lhs[1]);
  return {max, arith::AddFOp::create(
                   b, loc, larger,
                   arith::MulFOp::create(b, loc, smaller, scale))};
}

/// What an online state keeps its terms about for running max `max`: the
/// max, or 0 while the max is -inf (nothing but -inf so far), which keeps
/// -inf - -inf out.
Value runningCenter(OpBuilder &b, Location loc, Value max) {
  Value empty = arith::CmpFOp::create(
      b, loc, arith::CmpFPredicate::OEQ, max,
      floatConstant(b, loc, max, -std::numeric_limits<double>::infinity()));
  return arith::SelectOp::create(b, loc, empty, floatConstant(b, loc, max, 0.0),
                                 max);
}

/// What a max-deviation state's sum, kept about `from`'s runningCenter,
/// loses when its max grows to `to`: (to - center) times its sum of
/// weights, or nothing where the max did not grow (two -inf maxes, or the
/// same).
Value deviationShift(OpBuilder &b, Location loc, Value from, Value to,
                     Value weights) {
  Value zero = floatConstant(b, loc, from, 0.0);
  Value shift = arith::MulFOp::create(
      b, loc, arith::SubFOp::create(b, loc, to, runningCenter(b, loc, from)),
      weights);
  Value same =
      arith::CmpFOp::create(b, loc, arith::CmpFPredicate::OEQ, from, to);
  return arith::SelectOp::create(b, loc, same, zero, shift);
}

/// Merges two max-deviation states (m, W, S), S = sum of w * (x - m): each
/// sum is moved to the larger max (deviationShift). The terms are all at
/// most 0 for weights of at least 0, so nothing cancels; a NaN max makes S
/// NaN.
ReductionState combineMaxDeviation(OpBuilder &b, Location loc,
                                   ArrayRef<Value> lhs, ArrayRef<Value> rhs) {
  Value max = arith::MaximumFOp::create(b, loc, lhs[0], rhs[0]);
  Value weights = arith::AddFOp::create(b, loc, lhs[1], rhs[1]);
  Value left = arith::SubFOp::create(
      b, loc, lhs[2], deviationShift(b, loc, lhs[0], max, lhs[1]));
  Value right = arith::SubFOp::create(
      b, loc, rhs[2], deviationShift(b, loc, rhs[0], max, rhs[1]));
  return {max, weights, arith::AddFOp::create(b, loc, left, right)};
}

/// Chan's merge of two moments states (count, mean, M2, sum):
/// mean = mean_a + d * n_b / n, M2 = M2_a + M2_b + d^2 * n_a * n_b / n with
/// d = mean_b - mean_a (two empty states merge to an empty one); the sums
/// add.
ReductionState combineMoments(OpBuilder &b, Location loc, ArrayRef<Value> lhs,
                              ArrayRef<Value> rhs) {
  Value count = arith::AddFOp::create(b, loc, lhs[0], rhs[0]);
  Value delta = arith::SubFOp::create(b, loc, rhs[1], lhs[1]);
  Value share = arith::DivFOp::create(
      b, loc, rhs[0],
      arith::MaximumFOp::create(b, loc, count, floatConstant(b, loc, count, 1.0)));
  Value step = arith::MulFOp::create(b, loc, delta, share);
  Value mean = arith::AddFOp::create(b, loc, lhs[1], step);
  Value cross = arith::MulFOp::create(
      b, loc, arith::MulFOp::create(b, loc, delta, step), lhs[0]);
  Value m2 = arith::AddFOp::create(
      b, loc, arith::AddFOp::create(b, loc, lhs[2], rhs[2]), cross);
  Value sum = arith::AddFOp::create(b, loc, lhs[3], rhs[3]);
  return {count, mean, m2, sum};
}

/// Combines two states of `reduction`, as scalars or vectors.
ReductionState combineStates(OpBuilder &b, Location loc,
                             const RowReduction &reduction,
                             ArrayRef<Value> lhs, ArrayRef<Value> rhs,
                             const MathLowering &lowering) {
  switch (reduction.form) {
  case RowReduction::Form::Plain:
    return {combineReduction(b, loc, reduction.kind, lhs[0], rhs[0])};
  case RowReduction::Form::Arg:
    return combineArgReduction(b, loc, reduction.kind, lhs, rhs);
  case RowReduction::Form::MaxSumExp:
    return combineMaxSumExp(b, loc, lhs, rhs, lowering);
  case RowReduction::Form::MaxDeviation:
    return combineMaxDeviation(b, loc, lhs, rhs);
  case RowReduction::Form::Moments:
    return combineMoments(b, loc, lhs, rhs);
  }
  llvm_unreachable("unknown form");
}

vector::CombiningKind vectorCombiningKind(ReduceKind kind, bool isFloat) {
  switch (kind) {
  case ReduceKind::Sum:
  case ReduceKind::Mean:
    return vector::CombiningKind::ADD;
  case ReduceKind::Max:
    return isFloat ? vector::CombiningKind::MAXIMUMF
                   : vector::CombiningKind::MAXSI;
  case ReduceKind::Min:
    return isFloat ? vector::CombiningKind::MINIMUMF
                   : vector::CombiningKind::MINSI;
  }
  llvm_unreachable("unknown reduction");
}

/// `value` as the float type (or vector of floats) `type`: extended if that
/// is wider, truncated if narrower. bf16 <-> f16 goes exactly through f32,
/// then rounds once; f64 -> f16/bf16 rounds to f32 first, as PyTorch's
/// conversions do (and the CPU JIT has no __truncdfhf2/__truncdfbf2 to call).
Value castFloat(OpBuilder &b, Location loc, Value value, Type type) {
  auto from = cast<FloatType>(getElementTypeOrSelf(value.getType()));
  auto to = cast<FloatType>(getElementTypeOrSelf(type));
  if (from == to)
    return value;
  if (to.getWidth() > from.getWidth())
    return arith::ExtFOp::create(b, loc, type, value);
  Type f32 = b.getF32Type();
  if (auto vector = dyn_cast<VectorType>(type))
    f32 = vector.clone(f32);
  if (to.getWidth() == from.getWidth())
    value = arith::ExtFOp::create(b, loc, f32, value);
  else if (to.getWidth() < 32 && from.getWidth() > 32)
    value = arith::TruncFOp::create(b, loc, f32, value);
  return arith::TruncFOp::create(b, loc, type, value);
}

/// `input` (a value or vector) converted to the element type of `type`, as
/// fuse.cast converts: floats by castFloat, floats to integers toward zero,
/// masks (i1) as 0/1, other integers sign-extended or truncated.
Value convertElements(OpBuilder &b, Location loc, Value input, Type type) {
  Type from = getElementTypeOrSelf(input.getType());
  Type to = getElementTypeOrSelf(type);
  if (from == to)
    return input;
  bool isFloat = isa<FloatType>(from);
  bool toFloat = isa<FloatType>(to);
  if (isFloat && toFloat)
    return castFloat(b, loc, input, type);
  if (isFloat)
    return arith::FPToSIOp::create(b, loc, type, input);
  bool fromMask = from.isInteger(1);
  if (toFloat)
    return fromMask ? arith::UIToFPOp::create(b, loc, type, input).getResult()
                    : arith::SIToFPOp::create(b, loc, type, input).getResult();
  if (to.getIntOrFloatBitWidth() > from.getIntOrFloatBitWidth())
    return fromMask ? arith::ExtUIOp::create(b, loc, type, input).getResult()
                    : arith::ExtSIOp::create(b, loc, type, input).getResult();
  return arith::TruncIOp::create(b, loc, type, input);
}

Value indexConstant(OpBuilder &b, Location loc, int64_t value) {
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
    function_ref<SmallVector<Value>(ValueRange, ValueRange)> combine) {
  int levels = 1;
  for (int64_t span = kAccumulationBlock; span < maxCount && levels < 8;
       span *= kAccumulationBlock)
    ++levels;
  // Level L folds terms [base, count) in steps of kAccumulationBlock^L,
  // at most kAccumulationBlock of them unless it is the top level.
  std::function<SmallVector<Value>(int, Value)> emitLevel =
      [&](int level, Value base) -> SmallVector<Value> {
    int64_t span = 1;
    for (int l = 0; l < level; ++l)
      span *= kAccumulationBlock;
    Value trips = arith::CeilDivUIOp::create(
        b, loc, arith::SubIOp::create(b, loc, count, base),
        indexConstant(b, loc, span));
    if (level != levels - 1)
      trips = arith::MinUIOp::create(
          b, loc, trips, indexConstant(b, loc, kAccumulationBlock));
    auto loop = scf::ForOp::create(b, loc, indexConstant(b, loc, 0), trips,
                                   indexConstant(b, loc, 1), identities);
    OpBuilder::InsertionGuard insertion(b);
    b.setInsertionPointToStart(loop.getBody());
    Value index = arith::AddIOp::create(
        b, loc, base,
        arith::MulIOp::create(b, loc, loop.getInductionVar(),
                              indexConstant(b, loc, span)));
    ValueRange carried = loop.getRegionIterArgs();
    SmallVector<Value> next =
        level == 0 ? accumulate(index, carried)
                   : combine(carried, emitLevel(level - 1, index));
    // Without loop-carried values the builder already added the yield.
    if (!next.empty())
      scf::YieldOp::create(b, loc, next);
    return SmallVector<Value>(loop.getResults());
  };
  return emitLevel(levels - 1, indexConstant(b, loc, 0));
}

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

/// Unrolls the marked loops under `root` (GPU only), so that a thread has
/// several independent loads in flight rather than one.
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

/// The emitter for one kernel body. `pointers` and `scalars` map the fuse
/// kernel's inputs and outputs to the lowered function's arguments.
class RowProgramEmitter {
public:
  RowProgramEmitter(KernelOp kernel, const TileConfig &config,
                    const KernelShape &shape, RowMapping &mapping,
                    OpBuilder &builder)
      : kernel(kernel), config(config), n(shape.n), aligned(shape.aligned),
        mapping(mapping), b(builder), loc(kernel.getLoc()),
        mathLowering(MathLowering::of(config, shape)),
        // Predicated loads of a row zero their registers first (a move per
        // 32 bits: 7-17% more instructions at n = 1000 in the backward
        // norms, and issue-bound cross-entropy kernels lost 1-5% in the
        // traffic model); they pay where bytes count, in the HBM-bound
        // persistent grids of column reductions, whose blocks of several
        // row groups end with clamped rows and whose short rows end with
        // vectors past them. Elsewhere a tail vector or the last block's
        // clamped row reads what its neighbours just did (L1). (A gather's
        // one predicated load, emitGather, is not a row's.)
        predicatedLoads(config.isGPU() && shape.hasColumnReduction),
        loadsHeldPacked(shape.storageBytes == 2 &&
                        keepsWideRowOnChip(shape, config) &&
                        earlierPassesAreCheap(kernel)),
        columnsLoadedWithRow(columnsToLoadWithRow(kernel, shape, config)) {}

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
    bool unrolled = false; // a constant index: a chunk of a row on chip
    Value slot;  // chunk * threads_per_row + lane, unclamped
    bool staged = false; // its re-read inputs live in shared memory
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

  DenseMap<Value, Value> inputs;           // fuse input -> lowered argument
  DenseMap<unsigned, Value> outputs;       // output index -> pointer
  DenseMap<Value, int> levels;
  DenseMap<Value, Value> rowValues;        // per-row and scalar values
  DenseMap<Operation *, Value> momentShifts; // fuse.moments -> its row's shift
  SmallVector<Chunk> onChipChunks;         // reused by every pass
  DenseMap<Value, Value> stagePointers;    // re-read input -> its region
  DenseMap<unsigned, Value> partialPointers; // column output -> its region
  DenseMap<unsigned, int64_t> partialOffsets; // ... its offset in a group's
  Value stageBase, groupInBlock;
  int64_t stageGroupBytes = 0;
  /// Vectors of full inputs a loop over staged chunks loads an iteration
  /// (kStagedLoads where the block runs alone on its SM).
  int64_t stagedLoads = kStagedUnroll;
  DenseSet<Value> inSharedMemory;          // staged by an earlier pass
  DenseSet<Value> stagedThisPass;
  Value row, rowValid, rowGroup;
  bool plainsOnOneLane = false; // this pass's (foldsToOneLane)
  int maxLevel = 0;
  int finalLevel = 0;
  bool preloaded = false;
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
  if (config.isGPU() && config.threadsPerRow > 32) {
    result = kernel.walk([&](ReduceOp reduce) {
      if (reduce.isRowReduction() && !reduce.getResult().getType().isFloat()) {
        reduce.emitError("integer row reductions across warps are not "
                         "supported (threads-per-row > 32); cast to f32");
        return WalkResult::interrupt();
      }
      return WalkResult::advance();
    });
    if (result.wasInterrupted())
      return failure();
  }
  computeLevels();
  return success();
}

Value RowProgramEmitter::pointerAt(Value pointer, Type elementType,
                                   Value offset) {
  Value offset64 =
      arith::IndexCastOp::create(b, loc, b.getI64Type(), offset);
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

/// Both conditions; a null one holds.
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
  return std::min<int64_t>(
      16, vector.getNumElements() * storageBytes(vector.getElementType()));
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
        loaded = load(stage, vector, sharedOffset(chunk),
                      sharedAlignment(vector));
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

RowProgramEmitter::Chunk RowProgramEmitter::makeChunk(Value chunkIndex) {
  Chunk chunk;
  // base = (chunk * threads_per_row + lane) * V
  Value slot = arith::AddIOp::create(
      b, loc,
      arith::MulIOp::create(b, loc, chunkIndex,
                            indexConstant(b, loc, config.threadsPerRow)),
      mapping.lane());
  Value base = arith::MulIOp::create(
      b, loc, slot, indexConstant(b, loc, config.vectorWidth));
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
      return arith::ConstantOp::create(b, loc, SplatElementsAttr::get(vector, attr));
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
        return math::AbsIOp::create(b, loc, operands[0]);
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
        return arith::DivFOp::create(
            b, loc, one, arith::AddFOp::create(b, loc, one, exp));
      })
      .Case([&](CmpOp cmp) -> Value {
        if (isFloat) {
          arith::CmpFPredicate predicate = [&] {
            switch (cmp.getPredicate()) {
            case CmpPredicate::eq: return arith::CmpFPredicate::OEQ;
            case CmpPredicate::ne: return arith::CmpFPredicate::UNE;
            case CmpPredicate::lt: return arith::CmpFPredicate::OLT;
            case CmpPredicate::le: return arith::CmpFPredicate::OLE;
            case CmpPredicate::gt: return arith::CmpFPredicate::OGT;
            case CmpPredicate::ge: return arith::CmpFPredicate::OGE;
            }
            llvm_unreachable("unknown predicate");
          }();
          return arith::CmpFOp::create(b, loc, predicate, operands[0],
                                       operands[1]);
        }
        arith::CmpIPredicate predicate = [&] {
          switch (cmp.getPredicate()) {
          case CmpPredicate::eq: return arith::CmpIPredicate::eq;
          case CmpPredicate::ne: return arith::CmpIPredicate::ne;
          case CmpPredicate::lt: return arith::CmpIPredicate::slt;
          case CmpPredicate::le: return arith::CmpIPredicate::sle;
          case CmpPredicate::gt: return arith::CmpIPredicate::sgt;
          case CmpPredicate::ge: return arith::CmpIPredicate::sge;
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
  Value zero = arith::ConstantOp::create(b, loc, IntegerAttr::get(indexType, 0));
  Value size = arith::ConstantOp::create(b, loc, IntegerAttr::get(indexType, n));
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
                type, APFloat::getNaN(cast<FloatType>(type).getFloatSemantics())))
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
      return op.emitError("cannot lower ") << op.getName() << " on per-row values";
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
    lowered = isChunked(from) ? input
                              : vector::BroadcastOp::create(
                                    b, loc, chunkType(type.getElementType()),
                                    input)
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
        arith::ConstantOp::create(b, loc, DenseElementsAttr::get(vector, steps)));
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
    return arith::ConstantOp::create(
        b, loc, SplatElementsAttr::get(stateType, value));
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
    Value base =
        arith::IndexCastOp::create(b, loc, b.getI32Type(), chunk.base);
    state.push_back(arith::AddIOp::create(
        b, loc, vector::BroadcastOp::create(b, loc, columns, base),
        arith::ConstantOp::create(b, loc,
                                  DenseElementsAttr::get(columns,
                                                         ArrayRef(steps)))));
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
ReductionState
RowProgramEmitter::accumulateMaxSumExp(Chunk &chunk,
                                       const RowReduction &reduction,
                                       ArrayRef<Value> accumulator) {
  Value x = chunkState(chunk, reduction)[0];
  Value chunkMax = vector::ReductionOp::create(
      b, loc, vector::CombiningKind::MAXIMUMF, x);
  Value oldMax = vector::ExtractOp::create(b, loc, accumulator[0], 0);
  Value max = arith::MaximumFOp::create(b, loc, oldMax, chunkMax);
  Value shift = runningCenter(b, loc, max);
  Value scale = mathLowering.exp(
      b, loc, arith::SubFOp::create(b, loc, oldMax, shift));
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

void RowProgramEmitter::emitChunkWork(Chunk &chunk, bool isFinal,
                                      ArrayRef<RowReduction> reductions,
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
      Value offset = partials ? sharedOffset(chunk)
                              : flatOffset(rowGroup, chunk.base);
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
    scalar = lane == 0
                 ? laneState
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
  plainsOnOneLane =
      !config.rowOnChip &&
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
      streamChunks(first, end - first, first < config.stagedChunks,
                   reductions, isFinal, accumulators);
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
/// work (preloadInputs; the last count % group chunks follow one at a
/// time); in a pass that only loads, the innermost loop is unrolled.
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
  preloaded |= groups && size > 1;
  auto append = [&](SmallVector<ReductionState> folded) {
    if (!accumulators.empty())
      folded = combine(accumulators, folded);
    accumulators.assign(folded.begin(), folded.end());
  };
  if (groups)
    append(fold(first, groups, size));
  if (rest)
    append(fold(first + groups * size, rest, 1));
}

void RowProgramEmitter::forEachChunk(int64_t first, int64_t end,
                                     function_ref<void(Chunk &)> body) {
  if (first == end)
    return;
  auto loop = scf::ForOp::create(b, loc, indexConstant(b, loc, first),
                                 indexConstant(b, loc, end),
                                 indexConstant(b, loc, 1));
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
        SplatElementsAttr::get(chunkType(elementType),
                               reductionIdentity(reduce.getKind(), elementType)));
    // The chunks on chip, then those in global memory.
    forEachChunk(0, config.partialChunks, [&](Chunk &chunk) {
      store(identity, partialPointers.lookup(index), sharedOffset(chunk),
            sharedAlignment(identity.getType()));
    });
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

//===----------------------------------------------------------------------===//
// Shared by both targets: the lowered signature and the finalize function.
//===----------------------------------------------------------------------===//

/// The lowered parameter types of `kernel` (KernelABI.h), without the
/// target's trailing index parameters.
SmallVector<Type> loweredParameters(KernelOp kernel, Type pointer,
                                    const KernelAbi &abi) {
  SmallVector<Type> types;
  for (auto [name, input] :
       llvm::zip(kernel.getInputNames().getAsValueRange<StringAttr>(),
                 kernel.getInputTypes())) {
    auto type = cast<ValueType>(input);
    bool byValue = type.getKind() == ValueKind::Scalar &&
                   !abi.scalarPointers.count(name.str());
    types.push_back(byValue ? type.getElementType() : pointer);
  }
  for (size_t i = 0, e = kernel.getOutputTypes().size(); i < e; ++i)
    types.push_back(pointer);
  return types;
}

/// The element type a KernelAbi names (f32, f16, bf16, f64, i1, i32, i64).
Type abiDtype(MLIRContext *context, StringRef name) {
  Builder b(context);
  return llvm::StringSwitch<Type>(name)
      .Case("f32", b.getF32Type())
      .Case("f16", b.getF16Type())
      .Case("bf16", b.getBF16Type())
      .Case("f64", b.getF64Type())
      .Case("i1", b.getI1Type())
      .Case("i32", b.getI32Type())
      .Default(b.getI64Type());
}

/// Reads a scalar bound by pointer (`pointee` there) as input `index`'s
/// declared type.
Value readScalar(OpBuilder &b, Location loc, KernelOp kernel, unsigned index,
                 Value address, Type pointee) {
  Value value = LLVM::LoadOp::create(b, loc, pointee, address);
  Type declared =
      cast<ValueType>(kernel.getInputTypes()[index]).getElementType();
  return convertElements(b, loc, value, declared);
}

/// Binds the lowered arguments of a row program (inputs, then outputs),
/// reading the scalars bound by pointer once, here.
void bindArguments(RowProgramEmitter &emitter, OpBuilder &b, Location loc,
                   KernelOp kernel, const KernelAbi &abi,
                   ValueRange arguments) {
  unsigned numInputs = kernel.getInputTypes().size();
  for (auto [index, name] : llvm::enumerate(
           kernel.getInputNames().getAsValueRange<StringAttr>())) {
    Value argument = arguments[index];
    if (auto it = abi.scalarPointers.find(name.str());
        it != abi.scalarPointers.end())
      argument = readScalar(b, loc, kernel, index, argument,
                            abiDtype(kernel.getContext(), it->second));
    emitter.bindInput(index, argument);
  }
  for (unsigned i = 0, e = kernel.getOutputTypes().size(); i < e; ++i)
    emitter.bindOutput(i, arguments[numInputs + i]);
}

/// Column-reduction outputs: (reduction, storage element type).
SmallVector<std::pair<ReduceOp, Type>> columnReductions(KernelOp kernel) {
  SmallVector<std::pair<ReduceOp, Type>> result;
  auto yield = cast<YieldOp>(kernel.getEntryBlock().getTerminator());
  for (Value output : yield.getValues())
    if (valueType(output).getKind() == ValueKind::Col)
      result.push_back(
          {columnReductionOf(output), valueType(output).getElementType()});
  return result;
}

/// How many partial rows a finalize's blocked accumulation is laid out for
/// (more still add up right, the top level taking them all; each level
/// costs loop bounds in every thread): the CPU has one per
/// kCpuRowsPerPartial rows; a GPU slice a finalizeSlices(n)-th of at most
/// 4 blocks per SM (TileConfig.h; or of their row groups, for partials that
/// do not fit on chip): a few hundred on today's chips.
constexpr int64_t kMaxCpuPartialRows = int64_t(1) << 24;
constexpr int64_t kMaxSliceRows = 256;

/// `index` frozen: opaque to LLVM's scalar evolution, so that loop strength
/// reduction does not search rewrites of every address computed from it
/// (an unclamped row: 13.8 -> 29.7 M instructions of loop passes in three
/// rms_norm_bwd compiles).
Value freezeIndex(OpBuilder &b, Location loc, Value index) {
  Value wide = arith::IndexCastOp::create(b, loc, b.getI64Type(), index);
  return arith::IndexCastOp::create(b, loc, b.getIndexType(),
                                    LLVM::FreezeOp::create(b, loc, wide));
}

/// A finalize's arguments: (partials, output) per column reduction, then
/// row_groups and rows (i64).
Value finalizeRowGroups(OpBuilder &b, Location loc, KernelOp kernel,
                        ValueRange arguments) {
  return arith::IndexCastOp::create(
      b, loc, b.getIndexType(),
      arguments[2 * columnReductions(kernel).size()]);
}

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
                                   bool freezeStart) {
  auto reductions = columnReductions(kernel);
  // Per column reduction: partials[first, column], and the identity.
  SmallVector<Value> starts, identities;
  for (auto [position, entry] : llvm::enumerate(reductions)) {
    Type compute = valueType(entry.first.getInput()).getElementType();
    Value start = LLVM::GEPOp::create(
        b, loc, arguments[2 * position].getType(), compute,
        arguments[2 * position],
        ValueRange{arith::IndexCastOp::create(
            b, loc, b.getI64Type(),
            arith::AddIOp::create(
                b, loc,
                arith::MulIOp::create(b, loc, first, indexConstant(b, loc, n)),
                column))});
    starts.push_back(freezeStart ? LLVM::FreezeOp::create(b, loc, start)
                                 : start);
    identities.push_back(arith::ConstantOp::create(
        b, loc, reductionIdentity(entry.first.getKind(), compute)));
  }
  // Rows [firstRow, min(firstRow + group, count)) of every reduction's
  // partials, all loaded before any is combined; firstRow < count.
  auto combineGroup = [&](Value firstRow,
                          ValueRange carried) -> SmallVector<Value> {
    Value left = arith::SubIOp::create(b, loc, count, firstRow);
    SmallVector<Value> present;
    for (int64_t row = 1; row < group; ++row)
      present.push_back(arith::CmpIOp::create(
          b, loc, arith::CmpIPredicate::ult, indexConstant(b, loc, row), left));
    SmallVector<SmallVector<Value>> loaded(reductions.size());
    for (auto [position, entry] : llvm::enumerate(reductions)) {
      Type compute = identities[position].getType();
      Value base = LLVM::GEPOp::create(
          b, loc, starts[position].getType(), compute, starts[position],
          ValueRange{arith::IndexCastOp::create(
              b, loc, b.getI64Type(),
              arith::MulIOp::create(b, loc, firstRow,
                                    indexConstant(b, loc, n)))});
      loaded[position].push_back(LLVM::LoadOp::create(b, loc, compute, base));
      for (int64_t row = 1; row < group; ++row)
        loaded[position].push_back(predicatedLoad(
            b, loc, base, row * n * storageBytes(compute), present[row - 1],
            identities[position], storageBytes(compute), /*mayMerge=*/true));
    }
    // The group's own total first, in pairs: a partial then takes part in
    // at most 4 + 16 additions for a slice of 256 rows. A row past the
    // share adds its identity, which changes nothing (the running total
    // starts at +0, so a -0 partial is lost either way); selecting the sum
    // without it instead made ptxas wait for the first loads before it
    // issued the rest (SASS: 4 of 16 loads, then additions).
    SmallVector<Value> next;
    for (auto [position, entry] : llvm::enumerate(reductions)) {
      ReduceKind kind = entry.first.getKind();
      SmallVector<Value> terms = loaded[position];
      while (terms.size() > 1) {
        SmallVector<Value> pairs;
        for (size_t i = 0; i + 1 < terms.size(); i += 2)
          pairs.push_back(
              combineReduction(b, loc, kind, terms[i], terms[i + 1]));
        if (terms.size() % 2)
          pairs.push_back(terms.back());
        terms = std::move(pairs);
      }
      next.push_back(
          combineReduction(b, loc, kind, carried[position], terms[0]));
    }
    return next;
  };
  return emitBlockedAccumulation(
      b, loc,
      arith::CeilDivUIOp::create(b, loc, count, indexConstant(b, loc, group)),
      llvm::divideCeil(maxCount, group), identities,
      [&](Value index, ValueRange carried) {
        return combineGroup(
            arith::MulIOp::create(b, loc, index, indexConstant(b, loc, group)),
            carried);
      },
      [&](ValueRange lhs, ValueRange rhs) {
        SmallVector<Value> combined;
        for (auto [position, entry] : llvm::enumerate(reductions))
          combined.push_back(combineReduction(b, loc, entry.first.getKind(),
                                              lhs[position], rhs[position]));
        return combined;
      });
}

/// out[column] = total (a mean divided by rows), in the output's dtype.
void storeFinalized(OpBuilder &b, Location loc, KernelOp kernel,
                    ValueRange arguments, Value column,
                    ArrayRef<Value> totals) {
  auto reductions = columnReductions(kernel);
  Value rows = arguments[2 * reductions.size() + 1];
  for (auto [position, entry, total] : llvm::enumerate(reductions, totals)) {
    auto [reduce, storage] = entry;
    Value output = arguments[2 * position + 1];
    Type compute = valueType(reduce.getInput()).getElementType();
    Value value = total;
    if (reduce.getKind() == ReduceKind::Mean)
      value = arith::DivFOp::create(
          b, loc, value, arith::SIToFPOp::create(b, loc, compute, rows));
    value = castFloat(b, loc, value, storage);
    Value column64 = arith::IndexCastOp::create(b, loc, b.getI64Type(), column);
    Value address = LLVM::GEPOp::create(b, loc, output.getType(), storage,
                                        output, ValueRange{column64});
    LLVM::StoreOp::create(b, loc, value, address);
  }
}

SmallVector<Type> finalizeParameters(KernelOp kernel, Type pointer) {
  SmallVector<Type> types(2 * columnReductions(kernel).size(), pointer);
  types.push_back(IntegerType::get(kernel.getContext(), 64)); // row_groups
  types.push_back(IntegerType::get(kernel.getContext(), 64)); // rows
  return types;
}

//===----------------------------------------------------------------------===//
// GPU
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

  Value isRowLeader(OpBuilder &b, Location loc) override {
    return arith::CmpIOp::create(b, loc, arith::CmpIPredicate::eq, laneIndex,
                                 indexConstant(b, loc, 0));
  }

  SmallVector<ReductionState>
  combineAcrossRow(OpBuilder &b, Location loc,
                   ArrayRef<RowReduction> reductions,
                   ArrayRef<ReductionState> partials) override {
    SmallVector<ReductionState> states(partials);
    // Within a warp: butterfly shuffles over the lanes of this row.
    if (config.threadsPerRow <= 32) {
      for (auto [reduction, state] : llvm::zip(reductions, states))
        state =
            combineAcrossLanes(b, loc, reduction, state, config.threadsPerRow);
      return states;
    }
    // Only each warp's lane 0 publishes its state: no lane needs the rest
    // to agree with it.
    for (auto [reduction, state] : llvm::zip(reductions, states))
      state = butterfly(b, loc, reduction, state, 32);
    // Across the warps of a row: lane 0 of each warp publishes its state in
    // workgroup memory; after a barrier lane l of every warp reads warp
    // l % warps' state and butterfly shuffles combine them, log2(warps)
    // deep (every warp the same way, so every thread of the row gets the
    // same bits). Reading every warp's state instead held them all at once
    // (16 warps' four cross-entropy states took 64 registers, one
    // 512-thread block per SM). A persistent block (the backward norms)
    // still reads them all and combines them in order: its lanes would keep
    // their slot's address live across all their rows, and ptxas spilled a
    // register at f32 n = 32000 (the shuffles took 102 registers to 80 at
    // f32 n = 1000, which changed no block count).
    int64_t warpsPerRow = config.threadsPerRow / 32;
    Value warpInRow = arith::DivUIOp::create(b, loc, laneIndex,
                                             indexConstant(b, loc, 32));
    Value laneInWarp = arith::RemUIOp::create(b, loc, laneIndex,
                                              indexConstant(b, loc, 32));
    auto slot = [&](Value warp, size_t component) -> Value {
      // ((group * warpsPerRow + warp) * maxReductions + component)
      Value rowWarp = arith::AddIOp::create(
          b, loc,
          arith::MulIOp::create(b, loc, groupInBlock,
                                indexConstant(b, loc, warpsPerRow)),
          warp);
      return arith::AddIOp::create(
          b, loc,
          arith::MulIOp::create(b, loc, rowWarp,
                                indexConstant(b, loc, maxReductions)),
          indexConstant(b, loc, component));
    };
    Value isWarpLeader = arith::CmpIOp::create(
        b, loc, arith::CmpIPredicate::eq, laneInWarp, indexConstant(b, loc, 0));
    emitGuarded(b, loc, isWarpLeader, [&] {
      size_t component = 0;
      for (const ReductionState &state : states)
        for (Value value : state)
          memref::StoreOp::create(b, loc, toSlot(b, loc, value), workgroup,
                                  slot(warpInRow, component++));
    });
    synchronizeRow(b, loc);
    bool inOrder = config.blocksPerSM > 0;
    Value sourceWarp =
        inOrder ? Value()
                : arith::RemUIOp::create(b, loc, laneInWarp,
                                         indexConstant(b, loc, warpsPerRow));
    size_t first = 0;
    for (auto [reduction, state] : llvm::zip(reductions, states)) {
      auto read = [&](Value warp) {
        ReductionState part;
        for (auto [index, value] : llvm::enumerate(state))
          part.push_back(
              fromSlot(b, loc,
                       memref::LoadOp::create(b, loc, workgroup,
                                              slot(warp, first + index)),
                       value.getType()));
        return part;
      };
      ReductionState total;
      if (inOrder) {
        total = read(indexConstant(b, loc, 0));
        for (int64_t warp = 1; warp < warpsPerRow; ++warp)
          total = combineStates(b, loc, reduction, total,
                                read(indexConstant(b, loc, warp)), math);
      } else {
        total = combineAcrossLanes(b, loc, reduction, read(sourceWarp),
                                   warpsPerRow);
      }
      first += state.size();
      state = total;
    }
    // The next reduction reuses the workgroup memory.
    synchronizeRow(b, loc);
    return states;
  }

private:
  /// `state` combined with the states of the lanes whose index differs in
  /// the bits below `lanes` (a power of two at most 32), by butterfly
  /// shuffles: each lane combines its own state with its partner's, so the
  /// lanes agree bit for bit where the combine is commutative (sums, max,
  /// min, arg reductions' lowest index, online softmax), not in Chan's
  /// merge of moments.
  ReductionState butterfly(OpBuilder &b, Location loc,
                           const RowReduction &reduction, ReductionState state,
                           int64_t lanes) {
    assert(llvm::isPowerOf2_64(lanes) && lanes <= 32 && "a warp's lanes");
    for (int64_t offset = 1; offset < lanes; offset *= 2) {
      ReductionState shuffled;
      for (Value value : state)
        shuffled.push_back(gpu::ShuffleOp::create(b, loc, value, offset, 32,
                                                  gpu::ShuffleMode::XOR)
                               .getShuffleResult());
      state = combineStates(b, loc, reduction, state, shuffled, math);
    }
    return state;
  }

  /// The butterfly, after which every lane of each group of `lanes` holds
  /// the same bits: where the combine is not commutative, the group's first
  /// lane's.
  ReductionState combineAcrossLanes(OpBuilder &b, Location loc,
                                    const RowReduction &reduction,
                                    ReductionState state, int64_t lanes) {
    state = butterfly(b, loc, reduction, state, lanes);
    if (lanes == 1 || reduction.form != RowReduction::Form::Moments)
      return state;
    Value lane = gpu::LaneIdOp::create(b, loc, /*upperBound=*/nullptr);
    Value first = arith::IndexCastOp::create(
        b, loc, b.getI32Type(),
        arith::AndIOp::create(b, loc, lane, indexConstant(b, loc, -lanes)));
    Value width = arith::ConstantOp::create(b, loc, b.getI32IntegerAttr(32));
    for (Value &value : state)
      value = gpu::ShuffleOp::create(b, loc, value, first, width,
                                     gpu::ShuffleMode::IDX)
                  .getShuffleResult();
    return state;
  }

  /// The row group's warps meet: at the block's barrier, or, where row
  /// groups of a folded block go at their own pace, at the group's named
  /// barrier (1 + the group; 0 is the block's).
  void synchronizeRow(OpBuilder &b, Location loc) {
    if (!namedBarriers) {
      gpu::BarrierOp::create(b, loc);
      return;
    }
    Type i32 = b.getI32Type();
    Value id = arith::IndexCastOp::create(
        b, loc, i32,
        arith::AddIOp::create(b, loc, groupInBlock, indexConstant(b, loc, 1)));
    Value threads = arith::ConstantOp::create(
        b, loc, b.getI32IntegerAttr(config.threadsPerRow));
    NVVM::BarrierOp::create(b, loc, Type(), id, threads,
                            NVVM::BarrierReductionAttr(), Value());
  }

  // Workgroup memory holds the widest float type the row reductions compute
  // in; checkSupported rejects integer reductions that would cross warps.
  Type slotType() const {
    return cast<MemRefType>(workgroup.getType()).getElementType();
  }
  /// A float in the slot's type; an arg reduction's i32 column as its bits.
  Value toSlot(OpBuilder &b, Location loc, Value value) const {
    if (isa<FloatType>(value.getType()))
      return castFloat(b, loc, value, slotType());
    unsigned width = slotType().getIntOrFloatBitWidth();
    if (width != value.getType().getIntOrFloatBitWidth())
      value = arith::ExtSIOp::create(b, loc, b.getIntegerType(width), value);
    return arith::BitcastOp::create(b, loc, slotType(), value);
  }
  Value fromSlot(OpBuilder &b, Location loc, Value slotValue, Type type) const {
    if (isa<FloatType>(type))
      return castFloat(b, loc, slotValue, type);
    unsigned width = slotType().getIntOrFloatBitWidth();
    Value bits = arith::BitcastOp::create(b, loc, b.getIntegerType(width),
                                          slotValue);
    if (width != type.getIntOrFloatBitWidth())
      bits = arith::TruncIOp::create(b, loc, type, bits);
    return bits;
  }

  const TileConfig &config;
  MathLowering math;
  Value laneIndex, groupInBlock, workgroup;
  int64_t maxReductions;
  bool namedBarriers;
};

/// `@<name>_finalize` (KernelABI.h): each block finalizes finalizeColumns(n)
/// columns with finalizeSlices(n) threads per column. Slice s combines its
/// contiguous share of the row groups (coalesced: a warp reads whole
/// sectors of consecutive columns), then slice 0 combines the slices'
/// results in order: the same result for the same partials, and enough
/// blocks to fill the chip (a block per 8-32 columns, not per 256).
void emitGPUFinalize(OpBuilder &b, Location loc, KernelOp kernel,
                     gpu::GPUModuleOp module, Type pointer, int64_t n) {
  MLIRContext *context = kernel.getContext();
  auto reductions = columnReductions(kernel);
  SmallVector<Type> slotTypes;
  for (auto [reduce, storage] : reductions)
    slotTypes.push_back(MemRefType::get(
        {kFinalizeThreads}, valueType(reduce.getInput()).getElementType(),
        MemRefLayoutAttrInterface{},
        gpu::AddressSpaceAttr::get(context, gpu::AddressSpace::Workgroup)));
  auto finalize = gpu::GPUFuncOp::create(
      b, loc, (kernel.getSymName() + kFinalizeSuffix).str(),
      b.getFunctionType(finalizeParameters(kernel, pointer), {}), slotTypes,
      TypeRange{});
  finalize->setAttr(gpu::GPUDialect::getKernelFuncAttrName(), b.getUnitAttr());
  finalize.setKnownBlockSizeAttr(
      b.getDenseI32ArrayAttr({static_cast<int32_t>(kFinalizeThreads), 1, 1}));
  Block &entry = finalize.getBody().front();
  OpBuilder::InsertionGuard insertion(b);
  b.setInsertionPointToStart(&entry);
  ValueRange arguments =
      entry.getArguments().take_front(finalize.getNumArguments());
  Value thread = gpu::ThreadIdOp::create(b, loc, gpu::Dimension::x);
  int64_t columnsPerBlock = finalizeColumns(n), slices = finalizeSlices(n);
  Value columns = indexConstant(b, loc, columnsPerBlock);
  Value lane = arith::RemUIOp::create(b, loc, thread, columns);
  Value slice = arith::DivUIOp::create(b, loc, thread, columns);
  Value column = arith::AddIOp::create(
      b, loc,
      arith::MulIOp::create(b, loc,
                            gpu::BlockIdOp::create(b, loc, gpu::Dimension::x),
                            columns),
      lane);
  // Threads past the last column combine no row group (every thread
  // reaches the barrier) and store nothing.
  Value inRange = arith::CmpIOp::create(b, loc, arith::CmpIPredicate::ult,
                                        column, indexConstant(b, loc, n));
  Value rowGroups = finalizeRowGroups(b, loc, kernel, arguments);
  Value share = arith::CeilDivUIOp::create(
      b, loc, rowGroups, indexConstant(b, loc, slices));
  Value first = arith::MinUIOp::create(
      b, loc, arith::MulIOp::create(b, loc, slice, share), rowGroups);
  Value count = arith::SelectOp::create(
      b, loc, inRange,
      arith::MinUIOp::create(b, loc, share,
                             arith::SubIOp::create(b, loc, rowGroups, first)),
      indexConstant(b, loc, 0));
  SmallVector<Value> totals =
      combinePartials(b, loc, kernel, arguments, column, n, first, count,
                      kMaxSliceRows, kFinalizeGroup, /*freezeStart=*/true);
  ValueRange slots = finalize.getWorkgroupAttributions();
  for (auto [total, slot] : llvm::zip(totals, slots))
    memref::StoreOp::create(b, loc, total, slot, thread);
  gpu::BarrierOp::create(b, loc);
  Value isFirstSlice = arith::CmpIOp::create(
      b, loc, arith::CmpIPredicate::eq, slice, indexConstant(b, loc, 0));
  emitGuarded(b, loc, andConditions(b, loc, isFirstSlice, inRange), [&] {
    SmallVector<Value> combined;
    for (auto [entry, slot] : llvm::zip(reductions, slots)) {
      Value total;
      for (int64_t s = 0; s < slices; ++s) {
        Value part = memref::LoadOp::create(
            b, loc, slot,
            ValueRange{arith::AddIOp::create(
                b, loc, lane, indexConstant(b, loc, s * columnsPerBlock))});
        total = s == 0 ? part
                       : combineReduction(b, loc, entry.first.getKind(),
                                          total, part);
      }
      combined.push_back(total);
    }
    storeFinalized(b, loc, kernel, arguments, column, combined);
  });
  gpu::ReturnOp::create(b, loc);
  // LLVM would unroll the group loops again (NVPTX asks for runtime
  // unrolling of small loops), which gives loop strength reduction one base
  // per copy to search again (rms_norm_bwd: 57% of the finalize's code
  // generation).
  auto rolled = LLVM::LoopAnnotationAttr::get(
      context, {}, {}, {},
      LLVM::LoopUnrollAttr::get(context, b.getBoolAttr(true), {}, {}, {}, {},
                                {}, {}),
      {}, {}, {}, {}, {}, {}, {}, {}, {}, {}, {});
  finalize.walk(
      [&](scf::ForOp loop) { loop->setAttr(kLoopAnnotationAttr, rolled); });
}

/// The launch's dynamic shared memory (`.extern .shared` in PTX, sized by
/// the launch), declared once per module.
constexpr StringLiteral kStageSymbol = "tilefuse_stage";

/// The launch's dynamic shared memory.
Value dynamicSharedMemory(OpBuilder &b, Location loc,
                          gpu::GPUModuleOp module) {
  if (!module.lookupSymbol(kStageSymbol)) {
    OpBuilder::InsertionGuard insertion(b);
    b.setInsertionPointToStart(module.getBody());
    LLVM::GlobalOp::create(b, loc, LLVM::LLVMArrayType::get(b.getI8Type(), 0),
                           /*isConstant=*/false, LLVM::Linkage::External,
                           kStageSymbol, Attribute(), /*alignment=*/16,
                           /*addrSpace=*/3);
  }
  return LLVM::AddressOfOp::create(
      b, loc, LLVM::LLVMPointerType::get(b.getContext(), /*addressSpace=*/3),
      kStageSymbol);
}

LogicalResult lowerKernelToGPU(KernelOp kernel, gpu::GPUModuleOp module) {
  FailureOr<TileConfig> config = TileConfig::fromKernel(kernel);
  FailureOr<KernelShape> shape = getKernelShape(kernel);
  if (failed(config) || failed(shape))
    return failure();
  if (!config->isGPU())
    return kernel.emitError("kernel @")
           << kernel.getSymName() << " is tiled for " << config->target
           << ", not a GPU";
  MLIRContext *context = kernel.getContext();
  Location loc = kernel.getLoc();
  OpBuilder b(context);
  b.setInsertionPointToEnd(module.getBody());
  Type pointer = LLVM::LLVMPointerType::get(context, /*addressSpace=*/1);

  FailureOr<KernelAbi> abi = getKernelAbi(kernel);
  if (failed(abi))
    return failure();
  SmallVector<Type> parameters = loweredParameters(kernel, pointer, *abi);
  parameters.push_back(b.getI64Type()); // rows
  ReductionWorkgroup reductionSlots = reductionWorkgroup(kernel, *config);
  if (config->stageBytes + reductionSlots.bytes() >
      maxSharedBytesPerBlock(config->target))
    return kernel.emitError("the staged chunks (")
           << config->stageBytes << " bytes) and the row reductions' slots ("
           << reductionSlots.bytes() << ") exceed the shared memory a block "
           << "of " << config->target << " may have";
  SmallVector<Type> workgroupTypes;
  if (reductionSlots.slots)
    workgroupTypes.push_back(MemRefType::get(
        {reductionSlots.slots}, reductionSlots.slotType,
        MemRefLayoutAttrInterface{},
        gpu::AddressSpaceAttr::get(context, gpu::AddressSpace::Workgroup)));
  auto function = gpu::GPUFuncOp::create(b, loc, kernel.getSymName(),
                                         b.getFunctionType(parameters, {}),
                                         workgroupTypes, TypeRange{});
  function->setAttr(gpu::GPUDialect::getKernelFuncAttrName(), b.getUnitAttr());
  // A folded block's size is the runtime's (TileConfig.h).
  bool folded = foldsResidentBlocks(*config);
  if (!folded)
    function.setKnownBlockSizeAttr(b.getDenseI32ArrayAttr(
        {static_cast<int32_t>(config->threadsPerBlock()), 1, 1}));
  bool aloneOnSM = runsAloneOnSM(*config, reductionSlots.bytes());
  if (aloneOnSM)
    function->setAttr(NVVM::NVVMDialect::getMinctasmAttrName(),
                      b.getI32IntegerAttr(1));

  Block &entry = function.getBody().front();
  b.setInsertionPointToStart(&entry);
  // A folded block's size is at most maxFoldedRowGroups rows of threads.
  IntegerAttr threadBound =
      folded
          ? b.getIndexAttr(maxFoldedRowGroups(*config) * config->threadsPerRow)
          : IntegerAttr();
  auto dimensionX = gpu::DimensionAttr::get(context, gpu::Dimension::x);
  Value thread = gpu::ThreadIdOp::create(b, loc, dimensionX, threadBound);
  Value block = gpu::BlockIdOp::create(b, loc, gpu::Dimension::x);
  Value blocks = gpu::GridDimOp::create(b, loc, gpu::Dimension::x);
  Value tpr = indexConstant(b, loc, config->threadsPerRow);
  Value rpb =
      folded
          ? arith::DivUIOp::create(
                b, loc,
                gpu::BlockDimOp::create(b, loc, dimensionX, threadBound), tpr)
                .getResult()
          : indexConstant(b, loc, config->rowsPerBlock);
  Value lane = arith::RemUIOp::create(b, loc, thread, tpr);
  Value group = arith::DivUIOp::create(b, loc, thread, tpr);
  Value rowGroup = arith::AddIOp::create(
      b, loc, arith::MulIOp::create(b, loc, block, rpb), group);
  Value rowGroups = arith::MulIOp::create(b, loc, blocks, rpb);
  // Workgroup attributions follow the parameters among the block arguments.
  Value rows = arith::IndexCastOp::create(b, loc, b.getIndexType(),
                                          entry.getArgument(parameters.size() - 1));

  GPURowMapping mapping(*config, MathLowering::of(*config, *shape), lane, group,
                        reductionSlots.slots
                            ? Value(function.getWorkgroupAttributions().front())
                            : Value(),
                        reductionSlots.stateValues);
  RowProgramEmitter emitter(kernel, *config, *shape, mapping, b);
  if (failed(emitter.checkSupported()))
    return failure();
  bindArguments(emitter, b, loc, kernel, *abi, entry.getArguments());
  if (config->stageBytes)
    emitter.bindStage(dynamicSharedMemory(b, loc, module), group,
                      config->stageBytes / config->rowsPerBlock, aloneOnSM);
  emitter.emitPartialsInit(rowGroup);

  // Every thread of a block runs the same number of row iterations (the
  // reductions synchronize the block); a row group's rows past the end are
  // clamped, load nothing (predicatedLoads) and do not store. A block of
  // one row group has none: its trips end at the last row, which the
  // column reductions' grids rely on (the clamp cost layer_norm_bwd bf16
  // n = 4096 13 registers), freezing the row instead; elsewhere ptxas's
  // register choices moved without it (cross_entropy_capped_fwd f32 n =
  // 32000: 64% -> 52% in the traffic model), so they keep it. The row
  // groups of a folded block meet only at their own barriers, so each
  // ends at its own last row, where they are whole warps (a warp's
  // shuffles take every lane).
  bool groupsEndApart = folded && config->threadsPerRow >= 32;
  Value firstRow = groupsEndApart
                       ? rowGroup
                       : arith::MulIOp::create(b, loc, block, rpb).getResult();
  Value remaining = arith::SubIOp::create(
      b, loc, arith::MaxSIOp::create(b, loc, rows, firstRow), firstRow);
  Value trips = arith::CeilDivUIOp::create(b, loc, remaining, rowGroups);
  auto loop = scf::ForOp::create(b, loc, indexConstant(b, loc, 0), trips,
                                 indexConstant(b, loc, 1));
  b.setInsertionPointToStart(loop.getBody());
  Value row = arith::AddIOp::create(
      b, loc, rowGroup,
      arith::MulIOp::create(b, loc, loop.getInductionVar(), rowGroups));
  Value rowValid, emittedRow;
  if (!groupsEndApart &&
      (folded || config->rowsPerBlock > 1 || !shape->hasColumnReduction)) {
    rowValid =
        arith::CmpIOp::create(b, loc, arith::CmpIPredicate::ult, row, rows);
    Value lastRow =
        arith::SubIOp::create(b, loc, rows, indexConstant(b, loc, 1));
    emittedRow = arith::SelectOp::create(b, loc, rowValid, row, lastRow);
  } else {
    emittedRow = freezeIndex(b, loc, row);
  }
  if (failed(emitter.emitRow(emittedRow, rowValid, rowGroup)))
    return failure();
  b.setInsertionPointToEnd(&entry);
  emitter.emitPartialsFlush(block, rpb);
  gpu::ReturnOp::create(b, loc);
  unrollStreamLoops(function);
  if (emitter.loadsAhead())
    function->setAttr(kKeepLoadOrderAttr, b.getUnitAttr());

  if (columnReductions(kernel).empty())
    return success();
  b.setInsertionPointToEnd(module.getBody());
  emitGPUFinalize(b, loc, kernel, module, pointer, shape->n);
  return success();
}

/// Lowers a row program or, for a multi-tensor kernel, its multi-tensor
/// form (below, after the CPU's row mapping).
LogicalResult lowerAnyKernelToGPU(KernelOp kernel, gpu::GPUModuleOp module);

struct FuseLowerToGPUPass
    : tilefuse::impl::FuseLowerToGPUBase<FuseLowerToGPUPass> {
  void runOnOperation() override {
    ModuleOp module = getOperation();
    SmallVector<KernelOp> kernels(module.getOps<KernelOp>());
    if (kernels.empty())
      return;
    OpBuilder b(module.getBodyRegion());
    module->setAttr(gpu::GPUDialect::getContainerModuleAttrName(),
                    b.getUnitAttr());
    auto gpuModule =
        gpu::GPUModuleOp::create(b, module.getLoc(), kGPUModuleName);
    for (KernelOp kernel : kernels) {
      if (failed(lowerAnyKernelToGPU(kernel, gpuModule)))
        return signalPassFailure();
      kernel.erase();
    }
  }
};

//===----------------------------------------------------------------------===//
// CPU
//===----------------------------------------------------------------------===//

class CPURowMapping : public RowMapping {
public:
  explicit CPURowMapping(OpBuilder &b, Location loc)
      : zero(indexConstant(b, loc, 0)) {}
  Value lane() override { return zero; }
  Value isRowLeader(OpBuilder &, Location) override { return {}; }
  SmallVector<ReductionState>
  combineAcrossRow(OpBuilder &, Location, ArrayRef<RowReduction>,
                   ArrayRef<ReductionState> partials) override {
    return SmallVector<ReductionState>(partials);
  }

private:
  Value zero;
};

//===----------------------------------------------------------------------===//
// Multi-tensor kernels (KernelABI.h): the elementwise program of a kernel
// over a table of tensors, in chunks; the same emitter writes the body.
//===----------------------------------------------------------------------===//

/// How a multi-tensor kernel's ports map onto its table and parameters.
struct MultiTensorLayout {
  /// Per input: its table column (full inputs, per-tensor scalars) or -1.
  SmallVector<int64_t> inputColumn;
  /// Per output: its table column, or the column of the input it updates.
  SmallVector<int64_t> outputColumn;
  /// Pointer bindings of scalar inputs (shared or per tensor): pointee type.
  DenseMap<unsigned, Type> pointee;
  int64_t columns = 0;
  /// Parameters besides the table: scalars not per tensor, the skip flag.
  SmallVector<Type> parameters;
  Type skipType;

  MultiTensorLayout(KernelOp kernel, const KernelAbi &abi, Type pointer) {
    MLIRContext *context = kernel.getContext();
    auto dtype = [&](StringRef name) { return abiDtype(context, name); };
    SmallVector<StringRef> inputNames(
        kernel.getInputNames().getAsValueRange<StringAttr>());
    for (auto [index, name, type] :
         llvm::enumerate(inputNames, kernel.getInputTypes())) {
      auto valueType = cast<ValueType>(type);
      int64_t column = -1;
      if (valueType.getKind() == ValueKind::Full) {
        column = columns++;
      } else if (auto it = abi.perTensorScalars.find(name.str());
                 it != abi.perTensorScalars.end()) {
        column = columns++;
        pointee[index] = dtype(it->second);
      } else if (auto it = abi.scalarPointers.find(name.str());
                 it != abi.scalarPointers.end()) {
        pointee[index] = dtype(it->second);
        parameters.push_back(pointer);
      } else {
        parameters.push_back(valueType.getElementType());
      }
      inputColumn.push_back(column);
    }
    for (StringRef name :
         kernel.getOutputNames().getAsValueRange<StringAttr>()) {
      auto it = abi.inplace.find(name.str());
      outputColumn.push_back(
          it == abi.inplace.end()
              ? columns++
              : inputColumn[llvm::find(inputNames, it->second) -
                            inputNames.begin()]);
    }
    if (!abi.skipIf.empty()) {
      skipType = dtype(abi.skipIf);
      parameters.push_back(pointer);
    }
  }
};

/// Reads word `word` (index) of the table as an i64.
Value loadTableWord(OpBuilder &b, Location loc, Value table, Value word) {
  Value offset = arith::IndexCastOp::create(b, loc, b.getI64Type(), word);
  Value address = LLVM::GEPOp::create(b, loc, table.getType(), b.getI64Type(),
                                      table, ValueRange{offset});
  return LLVM::LoadOp::create(b, loc, b.getI64Type(), address, 8);
}

/// Whether the flag at `pointer` (of `type`) is nonzero (a NaN counts).
Value flagIsSet(OpBuilder &b, Location loc, Value pointer, Type type) {
  Value flag = LLVM::LoadOp::create(b, loc, type, pointer);
  if (auto floatType = dyn_cast<FloatType>(type))
    return arith::CmpFOp::create(
        b, loc, arith::CmpFPredicate::UNE, flag,
        arith::ConstantOp::create(b, loc, FloatAttr::get(floatType, 0.0)));
  return arith::CmpIOp::create(
      b, loc, arith::CmpIPredicate::ne, flag,
      arith::ConstantOp::create(b, loc, IntegerAttr::get(type, 0)));
}

/// Emits the kernel's multi-tensor body around `emitTensor`, which runs one
/// tensor given its row base in the table, its element count and whether
/// the tensor is this thread's; shared by both targets.
class MultiTensorEmitter {
public:
  MultiTensorEmitter(KernelOp kernel, const TileConfig &config,
                     const KernelShape &shape, const MultiTensorLayout &layout,
                     RowMapping &mapping, OpBuilder &b, Type pointer)
      : kernel(kernel), config(config), layout(layout), b(b), loc(kernel.getLoc()),
        pointer(pointer),
        vector(kernel, config, shape, mapping, b),
        scalarConfig(withWidth(config, 1)),
        tail(kernel, scalarConfig, shape, mapping, b) {}

  LogicalResult checkSupported() {
    return success(succeeded(vector.checkSupported()) &&
                   succeeded(tail.checkSupported()));
  }

  /// Binds the scalar parameters (`arguments`: the function's parameters
  /// after the table); shared pointers are read here, once.
  void bindScalars(ValueRange arguments) {
    unsigned next = 0;
    for (auto [index, column] : llvm::enumerate(layout.inputColumn)) {
      if (column >= 0)
        continue;
      Value argument = arguments[next++];
      if (Type pointee = layout.pointee.lookup(index))
        argument = readScalar(b, loc, kernel, index, argument, pointee);
      bind(index, argument);
    }
  }

  /// Binds tensor `rowBase`'s columns: pointers and per-tensor scalars.
  void bindTensor(Value table, Value rowBase) {
    auto column = [&](int64_t c) -> Value {
      Value word = arith::AddIOp::create(b, loc, rowBase,
                                         indexConstant(b, loc, 1 + c));
      return LLVM::IntToPtrOp::create(b, loc, pointer,
                                      loadTableWord(b, loc, table, word));
    };
    for (auto [index, c] : llvm::enumerate(layout.inputColumn)) {
      if (c < 0)
        continue;
      Value address = column(c);
      Type pointee = layout.pointee.lookup(index);
      bind(index, pointee ? readScalar(b, loc, kernel, index, address, pointee)
                          : address);
    }
    for (auto [index, c] : llvm::enumerate(layout.outputColumn)) {
      Value address = column(c);
      vector.bindOutput(index, address);
      tail.bindOutput(index, address);
    }
  }

  RowProgramEmitter &vectors() { return vector; }
  RowProgramEmitter &scalars() { return tail; }

private:
  static TileConfig withWidth(TileConfig config, int64_t width) {
    config.vectorWidth = width;
    return config;
  }
  void bind(unsigned index, Value value) {
    vector.bindInput(index, value);
    tail.bindInput(index, value);
  }

  KernelOp kernel;
  const TileConfig &config;
  const MultiTensorLayout &layout;
  OpBuilder &b;
  Location loc;
  Type pointer;
  RowProgramEmitter vector;
  TileConfig scalarConfig;
  RowProgramEmitter tail;
};

/// The table parameter's type: 64-bit words filling the parameter space
/// the other parameters leave (KernelABI.h).
LLVM::LLVMArrayType tableType(MLIRContext *context,
                              const MultiTensorLayout &layout) {
  return LLVM::LLVMArrayType::get(
      IntegerType::get(context, 64),
      multiTensorTableWords(layout.parameters.size()));
}

/// Runs `body` unless the skip flag (if any) is set.
template <typename Fn>
void unlessSkipped(OpBuilder &b, Location loc, const MultiTensorLayout &layout,
                   Value skipPointer, Fn body) {
  Value run;
  if (layout.skipType)
    run = arith::XOrIOp::create(
        b, loc, flagIsSet(b, loc, skipPointer, layout.skipType),
        arith::ConstantOp::create(b, loc, b.getBoolAttr(true)));
  emitGuarded(b, loc, run, body);
}

LogicalResult lowerMultiTensorKernelToGPU(KernelOp kernel,
                                          gpu::GPUModuleOp module,
                                          const TileConfig &config,
                                          const KernelShape &shape,
                                          const KernelAbi &abi) {
  MLIRContext *context = kernel.getContext();
  Location loc = kernel.getLoc();
  OpBuilder b(context);
  b.setInsertionPointToEnd(module.getBody());
  Type global = LLVM::LLVMPointerType::get(context, /*addressSpace=*/1);
  MultiTensorLayout layout(kernel, abi, global);
  // The table is passed by value (byval, set on the LLVM function after
  // conversion; see Pipeline.cpp): loads from it become ld.param.
  SmallVector<Type> parameters = {LLVM::LLVMPointerType::get(context)};
  llvm::append_range(parameters, layout.parameters);
  auto function = gpu::GPUFuncOp::create(b, loc, kernel.getSymName(),
                                         b.getFunctionType(parameters, {}));
  function->setAttr(gpu::GPUDialect::getKernelFuncAttrName(), b.getUnitAttr());
  function->setAttr(kParamTableAttr,
                    TypeAttr::get(tableType(context, layout)));
  function.setKnownBlockSizeAttr(b.getDenseI32ArrayAttr(
      {static_cast<int32_t>(config.threadsPerRow), 1, 1}));

  Block &entry = function.getBody().front();
  b.setInsertionPointToStart(&entry);
  Value thread = gpu::ThreadIdOp::create(b, loc, gpu::Dimension::x);
  Value block = gpu::BlockIdOp::create(b, loc, gpu::Dimension::x);
  Value blocks = gpu::GridDimOp::create(b, loc, gpu::Dimension::x);
  // One thread per lane: RowMapping's lane is the thread.
  GPURowMapping mapping(config, MathLowering::of(config, shape), thread,
                        indexConstant(b, loc, 0), Value(), 1);
  MultiTensorEmitter emitter(kernel, config, shape, layout, mapping, b, global);
  if (failed(emitter.checkSupported()))
    return failure();
  Value table = entry.getArgument(0);
  ValueRange rest = entry.getArguments().drop_front();
  LogicalResult result = success();
  unlessSkipped(b, loc, layout, layout.skipType ? rest.back() : Value(), [&] {
    emitter.bindScalars(rest);
    Value count = arith::IndexCastOp::create(
        b, loc, b.getIndexType(),
        loadTableWord(b, loc, table, indexConstant(b, loc, 0)));
    Value chunk = indexConstant(b, loc, config.chunkElements);
    Value zero = indexConstant(b, loc, 0), one = indexConstant(b, loc, 1);
    auto tensors = scf::ForOp::create(b, loc, zero, count, one, ValueRange{zero});
    OpBuilder::InsertionGuard insertion(b);
    b.setInsertionPointToStart(tensors.getBody());
    Value tensor = tensors.getInductionVar();
    Value firstChunk = tensors.getRegionIterArgs()[0];
    Value rowBase = arith::AddIOp::create(
        b, loc,
        arith::MulIOp::create(b, loc, tensor,
                              indexConstant(b, loc, layout.columns + 1)),
        one);
    Value n = arith::IndexCastOp::create(b, loc, b.getIndexType(),
                                         loadTableWord(b, loc, table, rowBase));
    Value chunks = arith::CeilDivUIOp::create(b, loc, n, chunk);
    // This block's first chunk of the tensor: the c with
    // (firstChunk + c) % blocks == block.
    Value phase = arith::RemUIOp::create(b, loc, firstChunk, blocks);
    Value mine = arith::RemUIOp::create(
        b, loc,
        arith::SubIOp::create(b, loc, arith::AddIOp::create(b, loc, block, blocks),
                              phase),
        blocks);
    Value hasWork = arith::CmpIOp::create(b, loc, arith::CmpIPredicate::ult,
                                          mine, chunks);
    emitGuarded(b, loc, hasWork, [&] {
      emitter.bindTensor(table, rowBase);
      if (failed(emitter.vectors().emitScalarValues())) {
        result = failure();
        return;
      }
      int64_t width = config.vectorWidth;
      Value whole = arith::MulIOp::create(
          b, loc,
          arith::DivUIOp::create(b, loc, n, indexConstant(b, loc, width)),
          indexConstant(b, loc, width));
      auto chunkLoop = scf::ForOp::create(b, loc, mine, chunks, blocks);
      OpBuilder::InsertionGuard inChunk(b);
      b.setInsertionPointToStart(chunkLoop.getBody());
      Value start =
          arith::MulIOp::create(b, loc, chunkLoop.getInductionVar(), chunk);
      auto sweep = scf::ForOp::create(b, loc, zero,
                                      indexConstant(b, loc, config.chunks), one);
      {
        OpBuilder::InsertionGuard inSweep(b);
        b.setInsertionPointToStart(sweep.getBody());
        // offset = start + (sweep * threads + thread) * V
        Value slot = arith::AddIOp::create(
            b, loc,
            arith::MulIOp::create(b, loc, sweep.getInductionVar(),
                                  indexConstant(b, loc, config.threadsPerRow)),
            thread);
        Value offset = arith::AddIOp::create(
            b, loc, start,
            arith::MulIOp::create(b, loc, slot, indexConstant(b, loc, width)));
        Value valid = arith::CmpIOp::create(b, loc, arith::CmpIPredicate::ult,
                                            offset, whole);
        emitGuarded(b, loc, valid,
                    [&] { emitter.vectors().emitElementwiseAt(offset); });
      }
      if (width == 1)
        return;
      // The last n % V elements, one per thread, in the chunk holding them.
      Value offset = arith::AddIOp::create(b, loc, whole, thread);
      Value end = arith::AddIOp::create(b, loc, start, chunk);
      Value inTail = andConditions(
          b, loc,
          arith::CmpIOp::create(b, loc, arith::CmpIPredicate::ult, offset, n),
          andConditions(
              b, loc,
              arith::CmpIOp::create(b, loc, arith::CmpIPredicate::uge, whole,
                                    start),
              arith::CmpIOp::create(b, loc, arith::CmpIPredicate::ult, whole,
                                    end)));
      emitGuarded(b, loc, inTail, [&] {
        if (failed(emitter.scalars().emitScalarValues())) {
          result = failure();
          return;
        }
        emitter.scalars().emitElementwiseAt(offset);
      });
    });
    scf::YieldOp::create(b, loc,
                         ValueRange{arith::AddIOp::create(b, loc, firstChunk,
                                                          chunks)});
  });
  b.setInsertionPointToEnd(&entry);
  gpu::ReturnOp::create(b, loc);
  return result;
}

LogicalResult lowerMultiTensorKernelToCPU(KernelOp kernel, ModuleOp module,
                                          const TileConfig &config,
                                          const KernelShape &shape,
                                          const KernelAbi &abi) {
  MLIRContext *context = kernel.getContext();
  Location loc = kernel.getLoc();
  OpBuilder b(context);
  b.setInsertionPoint(kernel);
  Type pointer = LLVM::LLVMPointerType::get(context);
  MultiTensorLayout layout(kernel, abi, pointer);
  SmallVector<Type> parameters = {pointer};
  llvm::append_range(parameters, layout.parameters);
  // t_begin, e_begin, t_last, e_end
  parameters.append(4, b.getI64Type());
  auto function = func::FuncOp::create(b, loc, kernel.getSymName(),
                                       b.getFunctionType(parameters, {}));
  Block *entry = function.addEntryBlock();
  b.setInsertionPointToStart(entry);
  auto index = [&](unsigned fromEnd) -> Value {
    return arith::IndexCastOp::create(
        b, loc, b.getIndexType(),
        entry->getArgument(entry->getNumArguments() - fromEnd));
  };
  Value tensorBegin = index(4), elementBegin = index(3), tensorLast = index(2),
        elementEnd = index(1);
  CPURowMapping mapping(b, loc);
  // Tasks start anywhere in a tensor: no access may assume alignment.
  KernelShape unaligned = shape;
  unaligned.aligned = false;
  MultiTensorEmitter emitter(kernel, config, unaligned, layout, mapping, b,
                             pointer);
  if (failed(emitter.checkSupported()))
    return failure();
  Value table = entry->getArgument(0);
  ValueRange scalars =
      entry->getArguments().slice(1, layout.parameters.size());
  LogicalResult result = success();
  unlessSkipped(b, loc, layout, layout.skipType ? scalars.back() : Value(), [&] {
    emitter.bindScalars(scalars);
    Value zero = indexConstant(b, loc, 0), one = indexConstant(b, loc, 1);
    auto tensors = scf::ForOp::create(
        b, loc, tensorBegin, arith::AddIOp::create(b, loc, tensorLast, one), one);
    OpBuilder::InsertionGuard insertion(b);
    b.setInsertionPointToStart(tensors.getBody());
    Value tensor = tensors.getInductionVar();
    Value rowBase = arith::AddIOp::create(
        b, loc,
        arith::MulIOp::create(b, loc, tensor,
                              indexConstant(b, loc, layout.columns + 1)),
        one);
    Value n = arith::IndexCastOp::create(b, loc, b.getIndexType(),
                                         loadTableWord(b, loc, table, rowBase));
    auto is = [&](Value bound) {
      return arith::CmpIOp::create(b, loc, arith::CmpIPredicate::eq, tensor,
                                   bound);
    };
    Value lo = arith::SelectOp::create(b, loc, is(tensorBegin), elementBegin,
                                       zero);
    Value hi = arith::SelectOp::create(b, loc, is(tensorLast), elementEnd, n);
    emitter.bindTensor(table, rowBase);
    if (failed(emitter.vectors().emitScalarValues()) ||
        failed(emitter.scalars().emitScalarValues())) {
      result = failure();
      return;
    }
    Value width = indexConstant(b, loc, config.vectorWidth);
    Value whole = arith::AddIOp::create(
        b, loc, lo,
        arith::MulIOp::create(
            b, loc,
            arith::DivUIOp::create(b, loc,
                                   arith::SubIOp::create(b, loc, hi, lo), width),
            width));
    auto vectors = scf::ForOp::create(b, loc, lo, whole, width);
    {
      OpBuilder::InsertionGuard inLoop(b);
      b.setInsertionPointToStart(vectors.getBody());
      emitter.vectors().emitElementwiseAt(vectors.getInductionVar());
    }
    auto rest = scf::ForOp::create(b, loc, whole, hi, one);
    OpBuilder::InsertionGuard inLoop(b);
    b.setInsertionPointToStart(rest.getBody());
    emitter.scalars().emitElementwiseAt(rest.getInductionVar());
  });
  b.setInsertionPointToEnd(entry);
  func::ReturnOp::create(b, loc);
  return result;
}

/// The multi-tensor configuration of `kernel`, when it is one.
struct MultiTensorKernel {
  TileConfig config;
  KernelShape shape;
  KernelAbi abi;
};
FailureOr<std::optional<MultiTensorKernel>> multiTensorKernel(KernelOp kernel) {
  FailureOr<KernelAbi> abi = getKernelAbi(kernel);
  if (failed(abi))
    return failure();
  if (!abi->multiTensor)
    return std::optional<MultiTensorKernel>();
  FailureOr<TileConfig> config = TileConfig::fromKernel(kernel);
  FailureOr<KernelShape> shape = getKernelShape(kernel);
  if (failed(config) || failed(shape))
    return failure();
  return std::optional<MultiTensorKernel>({*config, *shape, *abi});
}

LogicalResult lowerAnyKernelToGPU(KernelOp kernel, gpu::GPUModuleOp module) {
  auto multiTensor = multiTensorKernel(kernel);
  if (failed(multiTensor))
    return failure();
  if (!*multiTensor)
    return lowerKernelToGPU(kernel, module);
  return lowerMultiTensorKernelToGPU(kernel, module, (*multiTensor)->config,
                                     (*multiTensor)->shape,
                                     (*multiTensor)->abi);
}


LogicalResult lowerKernelToCPU(KernelOp kernel, ModuleOp module) {
  FailureOr<TileConfig> config = TileConfig::fromKernel(kernel);
  FailureOr<KernelShape> shape = getKernelShape(kernel);
  if (failed(config) || failed(shape))
    return failure();
  if (config->isGPU())
    return kernel.emitError("kernel @")
           << kernel.getSymName() << " is tiled for " << config->target
           << ", not the CPU";
  MLIRContext *context = kernel.getContext();
  Location loc = kernel.getLoc();
  OpBuilder b(context);
  b.setInsertionPoint(kernel);
  Type pointer = LLVM::LLVMPointerType::get(context);

  FailureOr<KernelAbi> abi = getKernelAbi(kernel);
  if (failed(abi))
    return failure();
  SmallVector<Type> parameters = loweredParameters(kernel, pointer, *abi);
  // rows, row_begin, row_end, row_group
  parameters.append(4, b.getI64Type());
  auto function = func::FuncOp::create(b, loc, kernel.getSymName(),
                                       b.getFunctionType(parameters, {}));
  Block *entry = function.addEntryBlock();
  b.setInsertionPointToStart(entry);
  auto index = [&](unsigned fromEnd) -> Value {
    return arith::IndexCastOp::create(
        b, loc, b.getIndexType(),
        entry->getArgument(entry->getNumArguments() - fromEnd));
  };
  Value rowBegin = index(3), rowEnd = index(2), rowGroup = index(1);

  CPURowMapping mapping(b, loc);
  RowProgramEmitter emitter(kernel, *config, *shape, mapping, b);
  if (failed(emitter.checkSupported()))
    return failure();
  bindArguments(emitter, b, loc, kernel, *abi, entry->getArguments());
  emitter.emitPartialsInit(rowGroup);
  auto loop = scf::ForOp::create(b, loc, rowBegin, rowEnd,
                                 indexConstant(b, loc, 1));
  b.setInsertionPointToStart(loop.getBody());
  if (failed(emitter.emitRow(loop.getInductionVar(), Value(), rowGroup)))
    return failure();
  b.setInsertionPointToEnd(entry);
  func::ReturnOp::create(b, loc);

  if (columnReductions(kernel).empty())
    return success();
  b.setInsertionPointAfter(function);
  auto finalize = func::FuncOp::create(
      b, loc, (kernel.getSymName() + kFinalizeSuffix).str(),
      b.getFunctionType(finalizeParameters(kernel, pointer), {}));
  Block *finalizeEntry = finalize.addEntryBlock();
  b.setInsertionPointToStart(finalizeEntry);
  auto columns = scf::ForOp::create(b, loc, indexConstant(b, loc, 0),
                                    indexConstant(b, loc, shape->n),
                                    indexConstant(b, loc, 1));
  b.setInsertionPointToStart(columns.getBody());
  ValueRange arguments = finalizeEntry->getArguments();
  Value column = columns.getInductionVar();
  storeFinalized(
      b, loc, kernel, arguments, column,
      combinePartials(b, loc, kernel, arguments, column, shape->n,
                      indexConstant(b, loc, 0),
                      finalizeRowGroups(b, loc, kernel, arguments),
                      kMaxCpuPartialRows, /*group=*/1, /*freezeStart=*/false));
  b.setInsertionPointToEnd(finalizeEntry);
  func::ReturnOp::create(b, loc);
  return success();
}

struct FuseLowerToCPUPass
    : tilefuse::impl::FuseLowerToCPUBase<FuseLowerToCPUPass> {
  void runOnOperation() override {
    SmallVector<KernelOp> kernels(getOperation().getOps<KernelOp>());
    for (KernelOp kernel : kernels) {
      auto multiTensor = multiTensorKernel(kernel);
      if (failed(multiTensor) ||
          failed(*multiTensor ? lowerMultiTensorKernelToCPU(
                                    kernel, getOperation(),
                                    (*multiTensor)->config,
                                    (*multiTensor)->shape, (*multiTensor)->abi)
                              : lowerKernelToCPU(kernel, getOperation())))
        return signalPassFailure();
      kernel.erase();
    }
  }
};

} // namespace

int64_t ReductionWorkgroup::bytes() const {
  return slots * storageBytes(slotType);
}

ReductionWorkgroup tilefuse::reductionWorkgroup(KernelOp kernel,
                                                const TileConfig &config) {
  ReductionWorkgroup workgroup;
  Builder b(kernel.getContext());
  workgroup.slotType = b.getF32Type();
  DenseMap<Value, int> levels = rowLevels(kernel);
  SmallVector<RowReduction> reductions = rowReductions(kernel, levels, -1);
  DenseMap<int, int64_t> stateValuesPerPass;
  for (const RowReduction &reduction : reductions) {
    if (valueType(reduction.input).getElementType().isF64())
      workgroup.slotType = b.getF64Type();
    int64_t &values = stateValuesPerPass[reducedLevel(reduction.op, levels)];
    values += reduction.stateSize();
    workgroup.stateValues = std::max(workgroup.stateValues, values);
  }
  int64_t rowGroups = foldsResidentBlocks(config) ? maxFoldedRowGroups(config)
                                                  : config.rowsPerBlock;
  if (config.threadsPerRow > 32 && !reductions.empty())
    workgroup.slots =
        rowGroups * (config.threadsPerRow / 32) * workgroup.stateValues;
  return workgroup;
}
