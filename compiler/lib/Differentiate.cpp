//===- Differentiate.cpp - reverse-mode AD of fuse kernels ----------------===//
//
// The backward body is built in a detached block whose arguments are added
// as the adjoint rules ask for forward values; the kernel is made at the
// end, with its inputs in their documented order (Differentiate.h).
//
//===----------------------------------------------------------------------===//

#include "tilefuse/Compiler/Differentiate.h"
#include "tilefuse/Compiler/Passes.h"
#include "tilefuse/Compiler/TileConfig.h"

#include "mlir/IR/Dominance.h"
#include "mlir/IR/IRMapping.h"
#include "mlir/Transforms/CSE.h"
#include "mlir/Transforms/GreedyPatternRewriteDriver.h"
#include "llvm/ADT/StringSet.h"
#include "llvm/ADT/TypeSwitch.h"

#include <cmath>

namespace tilefuse {
#define GEN_PASS_DEF_FUSEDIFFERENTIATE
#include "tilefuse/Compiler/Passes.h.inc"
} // namespace tilefuse

using namespace mlir;
using namespace tilefuse;
using namespace tilefuse::fuse;

namespace {

ValueType valueType(Value value) { return cast<ValueType>(value.getType()); }

/// Where an input of the backward kernel comes from, in the order the
/// kernel declares them.
struct BackwardInput {
  enum Source { OutputGradient, ForwardInput, Saved, SavedArg };
  Source source;
  /// Output index, forward input index, or the program position of the
  /// saved value's op (a saved arg comes right after its reduction).
  unsigned position;
  std::string name;
  Type type;
  BlockArgument argument; // in the detached body
  /// Saved: the forward value; SavedArg: the forward row max/min.
  Value forwardValue;
};

/// A term of a split row sum: +-factor * (the row sum of leaf), where
/// factor is per-row (null: 1) and leaf full, or per-row (a value broadcast
/// along the row, which sums to leaf * n).
struct SumTerm {
  Value factor;
  bool negative;
  Value leaf;
};

class BackwardBuilder {
public:
  BackwardBuilder(KernelOp forward, OpBuilder &moduleBuilder)
      : forward(forward), moduleBuilder(moduleBuilder),
        b(forward.getContext()), loc(forward.getLoc()) {}

  FailureOr<Derivative> build(const DifferentiateOptions &options);

private:
  // Analysis of the forward kernel.
  LogicalResult resolveNames(const DifferentiateOptions &options);
  void analyzeForward();

  // The backward body.
  BlockArgument addInput(BackwardInput::Source source, unsigned position,
                         StringRef name, Type type, Value forwardValue);
  Value primal(Value value);
  Value savedArg(ReduceOp reduce);
  void accumulate(Value forwardValue, Value contribution);
  LogicalResult propagate(Operation *op, Value gradient);
  LogicalResult propagateReduce(ReduceOp reduce, Value gradient);
  void propagateElementwise(Operation *op, Value gradient);

  // Arithmetic on backward values: operands are broadcast to the kind they
  // join to (a column's deferred adjoint is full).
  Value constantLike(Value like, double value);
  Value broadcast(Value value, ValueKind kind);
  template <typename OpTy> Value binary(Value lhs, Value rhs);
  Value neg(Value value) { return NegOp::create(b, loc, value.getType(), value); }
  Value compare(CmpPredicate predicate, Value lhs, Value rhs);
  Value select(Value condition, Value ifTrue, Value ifFalse);
  Value rowLength(Type elementType);

  // Row sums, split where that helps (Differentiate.h).
  Value rowSum(Value full);
  void splitSum(Value full, Value factor, bool negative,
                SmallVectorImpl<SumTerm> &terms);
  Value timesRowLength(Value row);
  Value rowBroadcastSource(Value value);
  Value knownRowSum(Value leaf);
  Value reduceRow(Value leaf);
  int level(Value value);

  SmallVector<BackwardInput *> orderedInputs();
  FailureOr<KernelOp> finishBackward(const DifferentiateOptions &options);
  KernelOp finishForward(Derivative &derivative);
  std::string uniqueName(const Twine &base);

  KernelOp forward;
  OpBuilder &moduleBuilder;
  OpBuilder b;
  Location loc;

  SmallVector<unsigned> gradOutputs; // output indices given a gradient
  SmallVector<unsigned> gradInputs;  // input indices differentiated
  DenseSet<Value> varied;            // depend on a differentiated input
  DenseSet<Value> afterRowReduction; // depend on a row reduction
  DenseMap<Operation *, unsigned> position;
  DenseMap<Value, Operation *> forwardRowSums; // value -> its sum/mean

  std::unique_ptr<Block> body = std::make_unique<Block>();
  SmallVector<BackwardInput> inputs;
  DenseMap<Value, Value> primals;     // forward value -> backward value
  DenseMap<Value, Value> primalOf;    // backward value -> forward value
  DenseMap<Value, Value> savedArgs;   // forward row max/min -> its argmax
  DenseMap<Value, Value> adjoints;    // forward value -> adjoint
  DenseMap<Value, Value> rowSums;     // backward full value -> its row sum
  DenseMap<Value, int> levels;
  llvm::StringSet<> usedNames;
};

/// The indices of the `requested` names among `names` (every eligible one
/// when none is requested); `role` and `reason` word the errors.
static LogicalResult choosePorts(KernelOp kernel, ArrayRef<std::string> requested,
                                 ArrayAttr names, ArrayRef<Type> types,
                                 function_ref<bool(ValueType)> eligible,
                                 StringRef role, StringRef reason,
                                 SmallVectorImpl<unsigned> &chosen) {
  if (requested.empty()) {
    for (auto [index, type] : llvm::enumerate(types))
      if (eligible(cast<ValueType>(type)))
        chosen.push_back(index);
    return success();
  }
  for (const std::string &name : requested) {
    auto found = llvm::find(names.getAsValueRange<StringAttr>(), name);
    if (found == names.getAsValueRange<StringAttr>().end())
      return kernel.emitError("fuse-differentiate: kernel @")
             << kernel.getSymName() << " has no " << role << " '" << name
             << "'";
    unsigned index =
        std::distance(names.getAsValueRange<StringAttr>().begin(), found);
    if (!eligible(cast<ValueType>(types[index])))
      return kernel.emitError("fuse-differentiate: ")
             << role << " '" << name << "' is " << types[index] << reason;
    chosen.push_back(index);
  }
  return success();
}

LogicalResult BackwardBuilder::resolveNames(const DifferentiateOptions &options) {
  if (failed(choosePorts(
          forward, options.outputs, forward.getOutputNames(),
          forward.getOutputTypes(), [](ValueType type) { return type.isFloat(); },
          "output", ", not a float value: it has no gradient", gradOutputs)) ||
      failed(choosePorts(
          forward, options.inputs, forward.getInputNames(),
          forward.getInputTypes(),
          [](ValueType type) {
            return type.isFloat() && type.getKind() != ValueKind::Scalar;
          },
          "input",
          "; only full, per-row and per-column float inputs have gradients",
          gradInputs)))
    return failure();
  if (gradOutputs.empty() || gradInputs.empty())
    return forward.emitError("fuse-differentiate: kernel @")
           << forward.getSymName()
           << " has no float output or no differentiable input";
  return success();
}

void BackwardBuilder::analyzeForward() {
  Block &entry = forward.getEntryBlock();
  for (unsigned index : gradInputs)
    varied.insert(entry.getArgument(index));
  unsigned next = 0;
  for (Operation &op : entry.without_terminator()) {
    position[&op] = next++;
    bool fromReduction = isRowReduction(&op);
    bool fromVaried = false;
    for (Value operand : op.getOperands()) {
      fromReduction |= afterRowReduction.contains(operand);
      fromVaried |= varied.contains(operand);
    }
    for (Value result : op.getResults()) {
      if (fromReduction)
        afterRowReduction.insert(result);
      if (fromVaried && valueType(result).isFloat())
        varied.insert(result);
    }
    if (auto reduce = dyn_cast<ReduceOp>(op);
        reduce && reduce.isRowReduction() &&
        (reduce.getKind() == ReduceKind::Sum ||
         reduce.getKind() == ReduceKind::Mean))
      forwardRowSums.try_emplace(reduce.getInput(), reduce);
  }
  for (StringRef name : forward.getInputNames().getAsValueRange<StringAttr>())
    usedNames.insert(name);
  for (StringRef name : forward.getOutputNames().getAsValueRange<StringAttr>())
    usedNames.insert(name);
}

std::string BackwardBuilder::uniqueName(const Twine &base) {
  std::string name = base.str();
  for (int suffix = 1; usedNames.contains(name); ++suffix)
    name = (base + Twine(suffix)).str();
  usedNames.insert(name);
  return name;
}

BlockArgument BackwardBuilder::addInput(BackwardInput::Source source,
                                        unsigned inputPosition, StringRef name,
                                        Type type, Value forwardValue) {
  BlockArgument argument = body->addArgument(type, loc);
  inputs.push_back({source, inputPosition, name.str(), type, argument,
                    forwardValue});
  return argument;
}

/// The saved statistic's name: the forward output that already holds it, or
/// a new name after what computes it.
static std::string savedName(KernelOp forward, Value value) {
  auto yield = cast<YieldOp>(forward.getEntryBlock().getTerminator());
  for (auto [name, output] :
       llvm::zip(forward.getOutputNames().getAsValueRange<StringAttr>(),
                 yield.getValues()))
    if (output == value)
      return name.str();
  return "";
}

Value BackwardBuilder::primal(Value value) {
  if (Value known = primals.lookup(value))
    return known;
  Value result;
  if (auto arg = dyn_cast<BlockArgument>(value)) {
    result = addInput(BackwardInput::ForwardInput, arg.getArgNumber(),
                      cast<StringAttr>(forward.getInputNames()[arg.getArgNumber()])
                          .getValue(),
                      arg.getType(), value);
  } else if (valueType(value).getKind() == ValueKind::Row &&
             afterRowReduction.contains(value)) {
    Operation *op = value.getDefiningOp();
    std::string name = savedName(forward, value);
    if (name.empty()) {
      auto reduce = dyn_cast<ReduceOp>(op);
      name = uniqueName(reduce ? "row" + stringifyReduceKind(reduce.getKind())
                               : "saved");
    }
    result = addInput(BackwardInput::Saved, position.lookup(op), name,
                      value.getType(), value);
  } else {
    Operation *op = value.getDefiningOp();
    IRMapping mapping;
    for (Value operand : op->getOperands())
      mapping.map(operand, primal(operand));
    Operation *clone = b.clone(*op, mapping);
    for (auto [original, copy] :
         llvm::zip(op->getResults(), clone->getResults())) {
      primals[original] = copy;
      primalOf[copy] = original;
    }
    return primals.lookup(value);
  }
  primals[value] = result;
  primalOf[result] = value;
  return result;
}

Value BackwardBuilder::savedArg(ReduceOp reduce) {
  Value result = reduce.getResult();
  if (Value known = savedArgs.lookup(result))
    return known;
  std::string name = uniqueName(
      reduce.getKind() == ReduceKind::Max ? "argmax" : "argmin");
  // i32 columns (a row is shorter than 2^31): half the registers of i64.
  Type type = valueType(result).withElementType(b.getI32Type());
  Value arg = addInput(BackwardInput::SavedArg, position.lookup(reduce), name,
                       type, result);
  savedArgs[result] = arg;
  return arg;
}

void BackwardBuilder::accumulate(Value forwardValue, Value contribution) {
  if (!varied.contains(forwardValue))
    return;
  Value &adjoint = adjoints[forwardValue];
  adjoint = adjoint ? binary<AddOp>(adjoint, contribution) : contribution;
}

//===----------------------------------------------------------------------===//
// Arithmetic helpers
//===----------------------------------------------------------------------===//

Value BackwardBuilder::constantLike(Value like, double value) {
  return ConstantOp::create(b, loc, valueType(like), value);
}

Value BackwardBuilder::broadcast(Value value, ValueKind kind) {
  ValueType type = valueType(value);
  if (type.getKind() == kind)
    return value;
  return BroadcastOp::create(b, loc, type.withKind(kind), value);
}

template <typename OpTy> Value BackwardBuilder::binary(Value lhs, Value rhs) {
  ValueKind kind =
      joinKinds(valueType(lhs).getKind(), valueType(rhs).getKind());
  lhs = broadcast(lhs, kind);
  rhs = broadcast(rhs, kind);
  return OpTy::create(b, loc, lhs.getType(), lhs, rhs);
}

Value BackwardBuilder::compare(CmpPredicate predicate, Value lhs, Value rhs) {
  ValueKind kind =
      joinKinds(valueType(lhs).getKind(), valueType(rhs).getKind());
  lhs = broadcast(lhs, kind);
  rhs = broadcast(rhs, kind);
  return CmpOp::create(b, loc, valueType(lhs).withElementType(b.getI1Type()),
                       predicate, lhs, rhs);
}

Value BackwardBuilder::select(Value condition, Value ifTrue, Value ifFalse) {
  ValueKind kind = joinKinds(
      valueType(condition).getKind(),
      joinKinds(valueType(ifTrue).getKind(), valueType(ifFalse).getKind()));
  condition = broadcast(condition, kind);
  ifTrue = broadcast(ifTrue, kind);
  ifFalse = broadcast(ifFalse, kind);
  return SelectOp::create(b, loc, ifTrue.getType(), condition, ifTrue, ifFalse);
}

Value BackwardBuilder::rowLength(Type elementType) {
  return RowLengthOp::create(
      b, loc, ValueType::get(b.getContext(), ValueKind::Scalar, elementType));
}

//===----------------------------------------------------------------------===//
// Row sums
//===----------------------------------------------------------------------===//

int BackwardBuilder::level(Value value) {
  if (auto it = levels.find(value); it != levels.end())
    return it->second;
  int result = 0;
  if (Operation *op = value.getDefiningOp()) {
    for (Value operand : op->getOperands())
      result = std::max(result, level(operand));
    if (isRowReduction(op))
      ++result;
  }
  return levels[value] = result;
}

/// The per-row value `value` broadcasts along the row, if it is one (a
/// broadcast of a row or scalar, or a constant).
Value BackwardBuilder::rowBroadcastSource(Value value) {
  if (auto constant = value.getDefiningOp<ConstantOp>())
    return ConstantOp::create(b, loc,
                              valueType(value).withKind(ValueKind::Row),
                              constant.getValue());
  auto broadcastOp = value.getDefiningOp<BroadcastOp>();
  if (!broadcastOp)
    return {};
  Value source = broadcastOp.getInput();
  ValueKind kind = valueType(source).getKind();
  if (kind != ValueKind::Row && kind != ValueKind::Scalar)
    return {};
  return broadcast(source, ValueKind::Row);
}

void BackwardBuilder::splitSum(Value full, Value factor, bool negative,
                               SmallVectorImpl<SumTerm> &terms) {
  Operation *op = full.getDefiningOp();
  if (auto add = dyn_cast_or_null<AddOp>(op)) {
    splitSum(add.getLhs(), factor, negative, terms);
    splitSum(add.getRhs(), factor, negative, terms);
    return;
  }
  if (auto sub = dyn_cast_or_null<SubOp>(op)) {
    splitSum(sub.getLhs(), factor, negative, terms);
    splitSum(sub.getRhs(), factor, !negative, terms);
    return;
  }
  if (auto negation = dyn_cast_or_null<NegOp>(op)) {
    splitSum(negation.getOperand(), factor, !negative, terms);
    return;
  }
  if (auto mul = dyn_cast_or_null<MulOp>(op)) {
    for (auto [row, other] : {std::pair(mul.getLhs(), mul.getRhs()),
                              std::pair(mul.getRhs(), mul.getLhs())}) {
      if (Value source = rowBroadcastSource(row)) {
        splitSum(other, factor ? binary<MulOp>(factor, source) : source,
                 negative, terms);
        return;
      }
    }
  }
  Value source = rowBroadcastSource(full);
  terms.push_back({factor, negative, source ? source : full});
}

Value BackwardBuilder::timesRowLength(Value row) {
  return binary<MulOp>(row, rowLength(valueType(row).getElementType()));
}

/// The row sum of `leaf` if the forward took it (a sum or mean of the value
/// `leaf` recomputes): read from the saved statistic.
Value BackwardBuilder::knownRowSum(Value leaf) {
  Value forwardValue = primalOf.lookup(leaf);
  Operation *reduce = forwardValue ? forwardRowSums.lookup(forwardValue)
                                   : nullptr;
  if (!reduce)
    return {};
  Value sum = primal(reduce->getResult(0));
  if (cast<ReduceOp>(reduce).getKind() == ReduceKind::Mean)
    sum = timesRowLength(sum);
  return sum;
}

Value BackwardBuilder::reduceRow(Value leaf) {
  Value &sum = rowSums[leaf];
  if (!sum)
    sum = ReduceOp::create(b, loc, valueType(leaf).withKind(ValueKind::Row),
                           ReduceKind::Sum, leaf);
  return sum;
}

Value BackwardBuilder::rowSum(Value full) {
  if (Value known = rowSums.lookup(full))
    return known;
  // Split into terms; use the split form if it reduces at a lower level or
  // not at all. Whatever it built and does not use is dead code.
  SmallVector<SumTerm> terms;
  splitSum(full, Value(), /*negative=*/false, terms);
  int splitLevel = 0, reductions = 0;
  SmallVector<Value> sums;
  for (const SumTerm &term : terms) {
    Value sum;
    if (valueType(term.leaf).getKind() == ValueKind::Row)
      sum = timesRowLength(term.leaf);
    else if (!(sum = knownRowSum(term.leaf)))
      ++reductions;
    sums.push_back(sum);
    splitLevel = std::max(splitLevel, sum ? level(sum) : level(term.leaf) + 1);
    if (term.factor)
      splitLevel = std::max(splitLevel, level(term.factor));
  }
  int wholeLevel = level(full) + 1;
  if (splitLevel > wholeLevel ||
      (splitLevel == wholeLevel && reductions >= 1))
    return reduceRow(full);
  // Terms with one factor are summed before it multiplies them, so that
  // sum(x - mean(x)) comes out exactly 0, not a difference of two products.
  SmallVector<Value> factors;
  DenseMap<Value, Value> perFactor;
  for (auto [term, sum] : llvm::zip(terms, sums)) {
    if (!sum)
      sum = reduceRow(term.leaf);
    Value &total = perFactor[term.factor];
    if (!total)
      factors.push_back(term.factor);
    if (!total)
      total = term.negative ? neg(sum) : sum;
    else
      total = term.negative ? binary<SubOp>(total, sum)
                            : binary<AddOp>(total, sum);
  }
  Value total;
  for (Value factor : factors) {
    Value part = perFactor.lookup(factor);
    if (factor)
      part = binary<MulOp>(factor, part);
    total = total ? binary<AddOp>(total, part) : part;
  }
  return rowSums[full] = total;
}

//===----------------------------------------------------------------------===//
// Adjoint rules
//===----------------------------------------------------------------------===//

LogicalResult BackwardBuilder::propagateReduce(ReduceOp reduce, Value gradient) {
  Value input = reduce.getInput();
  if (!reduce.isRowReduction()) {
    if (reduce.getKind() != ReduceKind::Sum)
      return reduce.emitError("fuse-differentiate: a column ")
             << stringifyReduceKind(reduce.getKind())
             << " cannot be differentiated in one kernel (only column sums "
                "can)";
    accumulate(input, broadcast(gradient, ValueKind::Full));
    return success();
  }
  switch (reduce.getKind()) {
  case ReduceKind::Sum:
    accumulate(input, broadcast(gradient, ValueKind::Full));
    break;
  case ReduceKind::Mean:
    accumulate(input,
               broadcast(binary<DivOp>(gradient,
                                       rowLength(valueType(gradient)
                                                     .getElementType())),
                         ValueKind::Full));
    break;
  case ReduceKind::Max:
  case ReduceKind::Min: {
    // To the first extreme element of the row (its saved argmax/argmin).
    Value column = IotaOp::create(
        b, loc, ValueType::get(b.getContext(), ValueKind::Col, b.getI32Type()));
    Value isArg = compare(CmpPredicate::eq, savedArg(reduce), column);
    Value zero = constantLike(gradient, 0.0);
    accumulate(input, select(isArg, gradient, zero));
    break;
  }
  }
  return success();
}

void BackwardBuilder::propagateElementwise(Operation *op, Value dr) {
  auto x = [&](unsigned index) { return primal(op->getOperand(index)); };
  auto r = [&] { return primal(op->getResult(0)); };
  auto one = [&](Value like) { return constantLike(like, 1.0); };
  auto zero = [&](Value like) { return constantLike(like, 0.0); };
  auto add = [&](unsigned index, Value contribution) {
    accumulate(op->getOperand(index), contribution);
  };
  auto mul = [&](Value a, Value c) { return binary<MulOp>(a, c); };
  auto div = [&](Value a, Value c) { return binary<DivOp>(a, c); };
  auto sub = [&](Value a, Value c) { return binary<SubOp>(a, c); };
  auto varied = [&](unsigned index) {
    return this->varied.contains(op->getOperand(index));
  };

  llvm::TypeSwitch<Operation *>(op)
      .Case([&](NegOp) { add(0, neg(dr)); })
      .Case([&](AbsOp) {
        // grad * sgn(x); sgn(0) = sgn(NaN) = 0, as torch.sign.
        Value v = x(0);
        Value sign = sub(CastOp::create(b, loc, v.getType(),
                                        compare(CmpPredicate::gt, v, zero(v))),
                         CastOp::create(b, loc, v.getType(),
                                        compare(CmpPredicate::lt, v, zero(v))));
        add(0, mul(dr, sign));
      })
      .Case([&](ExpOp) { add(0, mul(dr, r())); })
      .Case([&](LogOp) { add(0, div(dr, x(0))); })
      .Case([&](SqrtOp) {
        add(0, div(dr, mul(r(), constantLike(r(), 2.0))));
      })
      .Case([&](RsqrtOp) {
        Value y = r();
        add(0, mul(dr, mul(mul(mul(y, y), y), constantLike(y, -0.5))));
      })
      .Case([&](TanhOp) {
        Value y = r();
        add(0, mul(dr, sub(one(y), mul(y, y))));
      })
      .Case([&](ErfOp) {
        Value v = x(0);
        Value gauss = ExpOp::create(b, loc, v.getType(), neg(mul(v, v)));
        add(0, mul(dr, mul(gauss, constantLike(v, 2.0 / std::sqrt(M_PI)))));
      })
      .Case([&](SigmoidOp) {
        Value y = r();
        add(0, mul(dr, mul(y, sub(one(y), y))));
      })
      .Case([&](Log1pOp) {
        Value v = x(0);
        add(0, div(dr, binary<AddOp>(v, one(v))));
      })
      .Case([&](Expm1Op) {
        Value y = r();
        add(0, mul(dr, binary<AddOp>(y, one(y))));
      })
      .Case([&](SinOp) {
        Value v = x(0);
        add(0, mul(dr, CosOp::create(b, loc, v.getType(), v)));
      })
      .Case([&](CosOp) {
        Value v = x(0);
        add(0, neg(mul(dr, SinOp::create(b, loc, v.getType(), v))));
      })
      .Case([&](AddOp) {
        add(0, dr);
        add(1, dr);
      })
      .Case([&](SubOp) {
        add(0, dr);
        if (varied(1))
          add(1, neg(dr));
      })
      .Case([&](MulOp) {
        if (varied(0))
          add(0, mul(dr, x(1)));
        if (varied(1))
          add(1, mul(dr, x(0)));
      })
      .Case([&](DivOp) {
        if (varied(0))
          add(0, div(dr, x(1)));
        if (varied(1)) // -grad * ((a / b) / b)
          add(1, neg(mul(dr, div(r(), x(1)))));
      })
      .Case<MaximumOp, MinimumOp>([&](auto) {
        // The larger (smaller) operand gets the gradient, each half of it
        // on a tie, both all of it when one is NaN (as torch).
        bool isMax = isa<MaximumOp>(op);
        Value a = x(0), c = x(1);
        Value half = mul(dr, constantLike(dr, 0.5));
        Value tie = compare(CmpPredicate::eq, a, c);
        for (unsigned index : {0u, 1u}) {
          if (!varied(index))
            continue;
          Value self = index == 0 ? a : c, other = index == 0 ? c : a;
          Value loses = compare(isMax ? CmpPredicate::lt : CmpPredicate::gt,
                                self, other);
          add(index, select(tie, half, select(loses, zero(dr), dr)));
        }
      })
      .Case([&](PowOp) {
        Value base = x(0), exponent = x(1);
        if (varied(0)) {
          // where(exponent == 0, 0, grad * exponent * base^(exponent - 1))
          Value power = PowOp::create(b, loc, base.getType(), base,
                                      sub(exponent, one(exponent)));
          add(0, select(compare(CmpPredicate::eq, exponent, zero(exponent)),
                        zero(dr), mul(dr, mul(exponent, power))));
        }
        if (varied(1)) {
          // grad * where(base == 0 & exponent >= 0, 0, result * log(base))
          Value baseZero = compare(CmpPredicate::eq, base, zero(base));
          Value nonNegative =
              compare(CmpPredicate::ge, exponent, zero(exponent));
          Value term = mul(r(), LogOp::create(b, loc, base.getType(), base));
          add(1, mul(dr, select(baseZero,
                                select(nonNegative, zero(term), term), term)));
        }
      })
      .Case([&](SelectOp select_) {
        Value condition = primal(select_.getCondition());
        if (varied(1))
          add(1, select(condition, dr, zero(dr)));
        if (varied(2))
          add(2, select(condition, zero(dr), dr));
      })
      .Case([&](CastOp cast) {
        if (varied(0))
          add(0, CastOp::create(
                     b, loc,
                     valueType(dr).withElementType(
                         valueType(cast.getInput()).getElementType()),
                     dr));
      })
      .Case([&](BroadcastOp broadcastOp) {
        Value input = broadcastOp.getInput();
        switch (valueType(input).getKind()) {
        case ValueKind::Row:
          add(0, rowSum(dr));
          break;
        case ValueKind::Col: // deferred: summed over rows at the input
          add(0, dr);
          break;
        default: // scalars have no gradient
          break;
        }
      })
      .Case([&](GatherOp gather) {
        // A one-hot at the gathered column of each row.
        Value index = primal(gather.getIndex());
        Value column = IotaOp::create(b, loc,
                                      valueType(index).withKind(ValueKind::Col));
        Value isIndex = compare(CmpPredicate::eq, index, column);
        Value wide = broadcast(dr, ValueKind::Full);
        add(0, select(isIndex, wide, zero(wide)));
      })
      // floor and round: zero gradient.
      .Default([](Operation *) {});
}

LogicalResult BackwardBuilder::propagate(Operation *op, Value gradient) {
  if (auto reduce = dyn_cast<ReduceOp>(op))
    return propagateReduce(reduce, gradient);
  propagateElementwise(op, gradient);
  return success();
}

//===----------------------------------------------------------------------===//
// The kernels
//===----------------------------------------------------------------------===//

/// Folds what the adjoint rules built (x * 1, broadcasts of constants),
/// merges common subexpressions and drops dead code.
static LogicalResult simplify(KernelOp kernel) {
  MLIRContext *context = kernel.getContext();
  RewritePatternSet patterns(context);
  for (RegisteredOperationName name : context->getRegisteredOperations())
    if (name.getDialectNamespace() == FuseDialect::getDialectNamespace())
      name.getCanonicalizationPatterns(patterns, context);
  if (failed(applyPatternsGreedily(kernel, std::move(patterns))))
    return kernel.emitError("fuse-differentiate: the backward kernel did not "
                            "converge under canonicalization");
  IRRewriter rewriter(context);
  DominanceInfo dominance(kernel);
  eliminateCommonSubExpressions(rewriter, dominance, kernel);
  return success();
}

static std::string backwardNameOf(KernelOp forward,
                                  const DifferentiateOptions &options) {
  if (!options.backwardName.empty())
    return options.backwardName;
  StringRef name = forward.getSymName();
  name.consume_back("_fwd");
  return (name + "_bwd").str();
}

/// The backward's inputs in their documented order: output gradients,
/// forward inputs, saved statistics in program order (an argmax right after
/// its row max).
SmallVector<BackwardInput *> BackwardBuilder::orderedInputs() {
  SmallVector<BackwardInput *> ordered;
  for (BackwardInput &input : inputs)
    ordered.push_back(&input);
  llvm::stable_sort(ordered, [](BackwardInput *a, BackwardInput *c) {
    auto rank = [](BackwardInput *input) {
      bool isArg = input->source == BackwardInput::SavedArg;
      int source = isArg ? BackwardInput::Saved : input->source;
      return std::tuple(source, input->position, isArg);
    };
    return rank(a) < rank(c);
  });
  return ordered;
}

FailureOr<KernelOp>
BackwardBuilder::finishBackward(const DifferentiateOptions &options) {
  // The gradients of the chosen inputs.
  SmallVector<Value> results;
  SmallVector<std::string> outputNames;
  Block &entry = forward.getEntryBlock();
  for (unsigned index : gradInputs) {
    BlockArgument input = entry.getArgument(index);
    Value gradient = adjoints.lookup(input);
    ValueType type = valueType(input);
    // A column's adjoint is deferred: the sum over rows of a full value.
    ValueKind kind = type.getKind() == ValueKind::Col ? ValueKind::Full
                                                     : type.getKind();
    if (!gradient)
      gradient = ConstantOp::create(b, loc, type.withKind(kind), 0.0);
    if (type.getKind() == ValueKind::Col) {
      // Sum in the compute type, then round once: the deferred adjoint of a
      // 16-bit column ends in the cast back to its storage type, and
      // summing rows after that cast would round every term (and the sum).
      auto narrowing = gradient.getDefiningOp<CastOp>();
      auto wide = narrowing
                      ? dyn_cast<FloatType>(
                            valueType(narrowing.getInput()).getElementType())
                      : FloatType();
      if (wide &&
          wide.getWidth() > type.getElementType().getIntOrFloatBitWidth())
        gradient = CastOp::create(
            b, loc, type,
            ReduceOp::create(
                b, loc,
                valueType(narrowing.getInput()).withKind(ValueKind::Col),
                ReduceKind::Sum, narrowing.getInput()));
      else
        gradient = ReduceOp::create(b, loc, type, ReduceKind::Sum, gradient);
    }
    results.push_back(gradient);
    outputNames.push_back(uniqueName(
        "d" + cast<StringAttr>(forward.getInputNames()[index]).getValue()));
  }

  SmallVector<BackwardInput *> ordered = orderedInputs();
  SmallVector<StringRef> inputNames;
  SmallVector<Type> inputTypes;
  for (BackwardInput *input : ordered) {
    inputNames.push_back(input->name);
    inputTypes.push_back(input->type);
  }
  SmallVector<StringRef> outputNameRefs(outputNames.begin(), outputNames.end());
  SmallVector<Type> outputTypes;
  for (Value result : results)
    outputTypes.push_back(result.getType());
  YieldOp::create(b, loc, results);

  auto kernel = KernelOp::create(moduleBuilder, loc,
                                 backwardNameOf(forward, options), inputNames,
                                 inputTypes, outputNameRefs, outputTypes);
  Block &kernelEntry = kernel.getEntryBlock();
  for (auto [input, argument] :
       llvm::zip(ordered, kernelEntry.getArguments()))
    input->argument.replaceAllUsesWith(argument);
  kernelEntry.getOperations().splice(kernelEntry.end(), body->getOperations());

  if (failed(simplify(kernel)))
    return failure();
  return kernel;
}

/// The derived forward: `forward` with the saved statistics appended to its
/// outputs; records where the backward's inputs come from.
KernelOp BackwardBuilder::finishForward(Derivative &derivative) {
  IRMapping mapping;
  auto derived = cast<KernelOp>(moduleBuilder.clone(*forward, mapping));
  auto yield = cast<YieldOp>(derived.getEntryBlock().getTerminator());
  SmallVector<Value> outputs(yield.getValues());
  SmallVector<Attribute> names(derived.getOutputNames().getValue());
  OpBuilder builder(yield);
  using Source = Derivative::Source;
  for (BackwardInput *input : orderedInputs()) {
    if (input->source == BackwardInput::OutputGradient ||
        input->source == BackwardInput::ForwardInput) {
      derivative.backwardInputs.push_back(
          {input->source == BackwardInput::OutputGradient ? Source::OutputGradient
                                                          : Source::Input,
           input->position});
      continue;
    }
    Value value = mapping.lookup(input->forwardValue);
    if (input->source == BackwardInput::SavedArg) {
      auto reduce = value.getDefiningOp<ReduceOp>();
      builder.setInsertionPointAfter(reduce);
      value = ArgReduceOp::create(builder, loc, input->type, reduce.getKind(),
                                  reduce.getInput());
    }
    // A statistic the forward already outputs is read from that output.
    auto *existing = llvm::find(outputs, value);
    derivative.backwardInputs.push_back(
        {Source::ForwardOutput,
         static_cast<unsigned>(existing - outputs.begin())});
    if (existing != outputs.end())
      continue;
    outputs.push_back(value);
    names.push_back(builder.getStringAttr(input->name));
  }
  builder.setInsertionPoint(yield);
  YieldOp::create(builder, yield.getLoc(), outputs);
  yield.erase();
  SmallVector<Type> types;
  for (Value output : outputs)
    types.push_back(output.getType());
  derived.setFunctionType(
      builder.getFunctionType(derived.getInputTypes(), types));
  derived.setOutputNamesAttr(builder.getArrayAttr(names));
  return derived;
}

FailureOr<Derivative>
BackwardBuilder::build(const DifferentiateOptions &options) {
  if (failed(resolveNames(options)))
    return failure();
  analyzeForward();
  b.setInsertionPointToEnd(body.get());

  // Seeds: the gradients of the chosen outputs.
  auto yield = cast<YieldOp>(forward.getEntryBlock().getTerminator());
  for (unsigned index : gradOutputs) {
    Value output = yield.getValues()[index];
    // A 16-bit column sum is the cast of its float32 sum.
    Value reduced = output;
    if (auto cast = output.getDefiningOp<CastOp>())
      reduced = cast.getInput();
    auto reduce = reduced.getDefiningOp<ReduceOp>();
    if (valueType(output).getKind() == ValueKind::Col && !reduce)
      return forward.emitError("fuse-differentiate: per-column output '")
             << cast<StringAttr>(forward.getOutputNames()[index]).getValue()
             << "' is not a column reduction";
    Value seed = addInput(
        BackwardInput::OutputGradient, index,
        uniqueName("d" + cast<StringAttr>(forward.getOutputNames()[index])
                             .getValue()),
        output.getType(), Value());
    if (varied.contains(output)) {
      Value &adjoint = adjoints[output];
      adjoint = adjoint ? binary<AddOp>(adjoint, seed) : seed;
    }
  }

  // Adjoints, last op first.
  for (Operation &op :
       llvm::reverse(forward.getEntryBlock().without_terminator())) {
    if (op.getNumResults() != 1)
      continue;
    Value gradient = adjoints.lookup(op.getResult(0));
    if (gradient && failed(propagate(&op, gradient)))
      return failure();
  }

  Derivative derivative;
  FailureOr<KernelOp> backward = finishBackward(options);
  if (failed(backward))
    return failure();
  derivative.backward = *backward;
  derivative.forward = finishForward(derivative);
  derivative.gradientOf.assign(gradInputs.begin(), gradInputs.end());
  return derivative;
}

//===----------------------------------------------------------------------===//
// The pass
//===----------------------------------------------------------------------===//

struct FuseDifferentiatePass
    : tilefuse::impl::FuseDifferentiateBase<FuseDifferentiatePass> {
  using FuseDifferentiateBase::FuseDifferentiateBase;

  void runOnOperation() override {
    DifferentiateOptions options;
    options.outputs.assign(outputs.begin(), outputs.end());
    options.inputs.assign(inputs.begin(), inputs.end());
    SmallVector<KernelOp> kernels;
    for (KernelOp kernel : getOperation().getOps<KernelOp>())
      if (kernelName.empty() || kernel.getSymName() == kernelName)
        kernels.push_back(kernel);
    if (kernels.empty() && !kernelName.empty()) {
      getOperation().emitError("fuse-differentiate: no kernel @")
          << kernelName;
      return signalPassFailure();
    }
    for (KernelOp kernel : kernels) {
      OpBuilder builder(kernel);
      builder.setInsertionPointAfter(kernel);
      FailureOr<Derivative> derivative =
          differentiate(kernel, options, builder);
      if (failed(derivative))
        return signalPassFailure();
      // The derived forward takes the kernel's place, before its backward.
      derivative->forward->moveBefore(derivative->backward);
      kernel.erase();
    }
  }
};

} // namespace

FailureOr<Derivative> tilefuse::differentiate(KernelOp kernel,
                                              const DifferentiateOptions &options,
                                              OpBuilder &builder) {
  // BackwardBuilder recurses along chains of ops (TileConfig.h's limits).
  if (failed(checkKernelOpLimit(kernel, "fuse-differentiate")))
    return failure();
  return BackwardBuilder(kernel, builder).build(options);
}

LogicalResult tilefuse::keepGradients(KernelOp backward, ArrayRef<bool> keep) {
  auto yield = cast<YieldOp>(backward.getEntryBlock().getTerminator());
  SmallVector<Value> values;
  SmallVector<Attribute> names;
  SmallVector<Type> types;
  for (auto [index, value] : llvm::enumerate(yield.getValues())) {
    if (index >= keep.size() || !keep[index])
      continue;
    values.push_back(value);
    names.push_back(backward.getOutputNames()[index]);
    types.push_back(value.getType());
  }
  OpBuilder builder(yield);
  YieldOp::create(builder, yield.getLoc(), values);
  yield.erase();
  backward.setOutputNamesAttr(builder.getArrayAttr(names));
  backward.setFunctionType(
      builder.getFunctionType(backward.getInputTypes(), types));
  return simplify(backward);
}
