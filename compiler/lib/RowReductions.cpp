//===- RowReductions.cpp - row reduction states and conversions -----------===//
//
// The states a thread carries for a row reduction and how two of them
// combine (RowReduction, combineStates), the blocked accumulation the row
// programs and the finalize fold with, how exp and tanh are emitted
// (MathLowering), and conversions between element types.
//
//===----------------------------------------------------------------------===//

#include "RowProgram.h"

#include "mlir/Dialect/Math/IR/Math.h"
#include "llvm/Support/MathExtras.h"

#include <functional>
#include <limits>

using namespace mlir;
using namespace tilefuse;
using namespace tilefuse::fuse;

namespace tilefuse::lowering {

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

SmallVector<RowReduction>
rowReductions(KernelOp kernel, const DenseMap<Value, int> &levels, int level) {
  SmallVector<RowReduction> reductions;
  for (Operation &op : kernel.getEntryBlock().without_terminator())
    if (std::optional<RowReduction> reduction = RowReduction::of(&op))
      if (level < 0 || reducedLevel(&op, levels) == level)
        reductions.push_back(*reduction);
  return reductions;
}

ReduceOp columnReductionOf(Value output) {
  if (auto cast = output.getDefiningOp<CastOp>())
    output = cast.getInput();
  auto reduce = output.getDefiningOp<ReduceOp>();
  return reduce && !reduce.isRowReduction() ? reduce : ReduceOp();
}

TypedAttr reductionIdentity(ReduceKind kind, Type type) {
  if (auto floatType = dyn_cast<FloatType>(type)) {
    const llvm::fltSemantics &semantics = floatType.getFloatSemantics();
    if (kind == ReduceKind::Max)
      return FloatAttr::get(type,
                            APFloat::getInf(semantics, /*Negative=*/true));
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
static ReductionState combineArgReduction(OpBuilder &b, Location loc,
                                          ReduceKind kind, ArrayRef<Value> lhs,
                                          ArrayRef<Value> rhs) {
  using arith::CmpFPredicate;
  using arith::CmpIPredicate;
  bool isMax = kind == ReduceKind::Max;
  auto cmpf = [&](CmpFPredicate predicate, Value x, Value y) -> Value {
    return arith::CmpFOp::create(b, loc, predicate, x, y);
  };
  auto cmpi = [&](CmpIPredicate predicate, Value x, Value y) -> Value {
    return arith::CmpIOp::create(b, loc, predicate, x, y);
  };
  Value lower = cmpi(CmpIPredicate::slt, rhs[1], lhs[1]);
  Value takeRhs;
  if (isa<FloatType>(getElementTypeOrSelf(lhs[0].getType()))) {
    Value lhsNaN = cmpf(CmpFPredicate::UNO, lhs[0], lhs[0]);
    Value rhsNaN = cmpf(CmpFPredicate::UNO, rhs[0], rhs[0]);
    Value beats =
        cmpf(isMax ? CmpFPredicate::OGT : CmpFPredicate::OLT, rhs[0], lhs[0]);
    Value equal =
        arith::OrIOp::create(b, loc, cmpf(CmpFPredicate::OEQ, rhs[0], lhs[0]),
                             arith::AndIOp::create(b, loc, lhsNaN, rhsNaN));
    Value onlyRhsNaN = arith::AndIOp::create(
        b, loc, rhsNaN, cmpf(CmpFPredicate::ORD, lhs[0], lhs[0]));
    takeRhs = arith::OrIOp::create(
        b, loc, arith::OrIOp::create(b, loc, onlyRhsNaN, beats),
        arith::AndIOp::create(b, loc, equal, lower));
  } else {
    Value beats =
        cmpi(isMax ? CmpIPredicate::sgt : CmpIPredicate::slt, rhs[0], lhs[0]);
    Value equal = cmpi(CmpIPredicate::eq, rhs[0], lhs[0]);
    takeRhs = arith::OrIOp::create(b, loc, beats,
                                   arith::AndIOp::create(b, loc, equal, lower));
  }
  return {arith::SelectOp::create(b, loc, takeRhs, rhs[0], lhs[0]),
          arith::SelectOp::create(b, loc, takeRhs, rhs[1], lhs[1])};
}

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

Value floatConstant(OpBuilder &b, Location loc, Value like, double value) {
  Type type = like.getType();
  auto attr = FloatAttr::get(getElementTypeOrSelf(type), value);
  if (auto vector = dyn_cast<VectorType>(type))
    return arith::ConstantOp::create(b, loc,
                                     SplatElementsAttr::get(vector, attr));
  return arith::ConstantOp::create(b, loc, attr);
}

/// ex2.approx(x * factor) for a scalar f32 x.
static Value exp2Scaled(OpBuilder &b, Location loc, Value x, double factor) {
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
    Value quotient =
        arith::DivFOp::create(b, loc, floatConstant(b, loc, y, -2.0),
                              denominator, arith::FastMathFlags::afn);
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
static ReductionState combineMaxSumExp(OpBuilder &b, Location loc,
                                       ArrayRef<Value> lhs, ArrayRef<Value> rhs,
                                       const MathLowering &lowering) {
  using arith::CmpFPredicate;
  Value max = arith::MaximumFOp::create(b, loc, lhs[0], rhs[0]);
  Value min = arith::MinimumFOp::create(b, loc, lhs[0], rhs[0]);
  Value difference = arith::SubFOp::create(b, loc, min, max);
  Value scale = lowering.exp(b, loc, difference);
  Value negInf =
      floatConstant(b, loc, max, -std::numeric_limits<double>::infinity());
  Value empty = arith::CmpFOp::create(b, loc, CmpFPredicate::OEQ, max, negInf);
  scale = arith::SelectOp::create(b, loc, empty,
                                  floatConstant(b, loc, max, 0.0), scale);
  Value lhsLarger =
      arith::CmpFOp::create(b, loc, CmpFPredicate::OGE, lhs[0], rhs[0]);
  Value larger = arith::SelectOp::create(b, loc, lhsLarger, lhs[1], rhs[1]);
  Value smaller = arith::SelectOp::create(b, loc, lhsLarger, rhs[1], lhs[1]);
  return {max,
          arith::AddFOp::create(b, loc, larger,
                                arith::MulFOp::create(b, loc, smaller, scale))};
}

Value runningCenter(OpBuilder &b, Location loc, Value max) {
  Value empty = arith::CmpFOp::create(
      b, loc, arith::CmpFPredicate::OEQ, max,
      floatConstant(b, loc, max, -std::numeric_limits<double>::infinity()));
  return arith::SelectOp::create(b, loc, empty, floatConstant(b, loc, max, 0.0),
                                 max);
}

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
static ReductionState combineMaxDeviation(OpBuilder &b, Location loc,
                                          ArrayRef<Value> lhs,
                                          ArrayRef<Value> rhs) {
  Value max = arith::MaximumFOp::create(b, loc, lhs[0], rhs[0]);
  Value weights = arith::AddFOp::create(b, loc, lhs[1], rhs[1]);
  Value left = arith::SubFOp::create(
      b, loc, lhs[2], deviationShift(b, loc, lhs[0], max, lhs[1]));
  Value right = arith::SubFOp::create(
      b, loc, rhs[2], deviationShift(b, loc, rhs[0], max, rhs[1]));
  return {max, weights, arith::AddFOp::create(b, loc, left, right)};
}

ReductionState combineMoments(OpBuilder &b, Location loc, ArrayRef<Value> lhs,
                              ArrayRef<Value> rhs) {
  Value count = arith::AddFOp::create(b, loc, lhs[0], rhs[0]);
  Value delta = arith::SubFOp::create(b, loc, rhs[1], lhs[1]);
  Value share = arith::DivFOp::create(
      b, loc, rhs[0],
      arith::MaximumFOp::create(b, loc, count,
                                floatConstant(b, loc, count, 1.0)));
  Value step = arith::MulFOp::create(b, loc, delta, share);
  Value mean = arith::AddFOp::create(b, loc, lhs[1], step);
  Value cross = arith::MulFOp::create(
      b, loc, arith::MulFOp::create(b, loc, delta, step), lhs[0]);
  Value m2 = arith::AddFOp::create(
      b, loc, arith::AddFOp::create(b, loc, lhs[2], rhs[2]), cross);
  Value sum = arith::AddFOp::create(b, loc, lhs[3], rhs[3]);
  return {count, mean, m2, sum};
}

ReductionState combineStates(OpBuilder &b, Location loc,
                             const RowReduction &reduction, ArrayRef<Value> lhs,
                             ArrayRef<Value> rhs,
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

Value castFloat(OpBuilder &b, Location loc, Value value, Type type) {
  auto from = cast<FloatType>(getElementTypeOrSelf(value.getType()));
  auto to = cast<FloatType>(getElementTypeOrSelf(type));
  if (from == to)
    return value;
  Type f32 = b.getF32Type();
  if (auto vector = dyn_cast<VectorType>(type))
    f32 = vector.clone(f32);
  if (to.getWidth() > from.getWidth()) {
    // A 16-bit float widens to f64 through f32 (exact either way): the CPU
    // pipeline turns bf16 -> f32 into integer operations, where a direct
    // bf16 -> f64 let LLVM compare in bf16 and call __truncsfbf2, which
    // the JIT does not have.
    if (from.getWidth() < 32 && to.getWidth() > 32)
      value = arith::ExtFOp::create(b, loc, f32, value);
    return arith::ExtFOp::create(b, loc, type, value);
  }
  if (to.getWidth() == from.getWidth())
    value = arith::ExtFOp::create(b, loc, f32, value);
  else if (to.getWidth() < 32 && from.getWidth() > 32)
    value = arith::TruncFOp::create(b, loc, f32, value);
  return arith::TruncFOp::create(b, loc, type, value);
}

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
      trips = arith::MinUIOp::create(b, loc, trips,
                                     indexConstant(b, loc, kAccumulationBlock));
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

} // namespace tilefuse::lowering
