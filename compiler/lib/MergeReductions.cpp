//===- MergeReductions.cpp - one pass over a streamed row -----------------===//
//
// Substitutes the one-pass forms of two dependent row reductions (see
// Passes.td): max then sum(exp(x - max)), mean then the sum or mean of
// (x - mean)^2, and a weighted sum of x about a row value a later pass
// gives. The lowering computes each merged op's state in the pass over its
// input's level.
//
//===----------------------------------------------------------------------===//

#include "tilefuse/Compiler/Passes.h"
#include "tilefuse/Compiler/TileConfig.h"

#include "mlir/IR/IRMapping.h"

namespace tilefuse {
#define GEN_PASS_DEF_FUSEMERGEREDUCTIONS
#include "tilefuse/Compiler/Passes.h.inc"
} // namespace tilefuse

using namespace mlir;
using namespace tilefuse;
using namespace tilefuse::fuse;

namespace {

/// The row reduction of `kind` over `input` whose result `value` is a
/// broadcast of, or null.
ReduceOp broadcastRowReduction(Value value, ReduceKind kind, Value input) {
  auto broadcast = value.getDefiningOp<BroadcastOp>();
  auto reduce =
      broadcast ? broadcast.getInput().getDefiningOp<ReduceOp>() : ReduceOp();
  if (!reduce || !reduce.isRowReduction() || reduce.getKind() != kind ||
      reduce.getInput() != input)
    return {};
  return reduce;
}

/// For `centered` = x - broadcast(reduce kind x): that first reduction.
ReduceOp centeringReduction(Value centered, ReduceKind kind) {
  auto sub = centered.getDefiningOp<SubOp>();
  return sub ? broadcastRowReduction(sub.getRhs(), kind, sub.getLhs())
             : ReduceOp();
}

/// Erases the ops of `roots` that nothing uses, then the producers of their
/// operands that this leaves unused. An op is visited once even when it
/// feeds several of them (x * x, or `first` feeding `second`).
void eraseDead(ArrayRef<Operation *> roots) {
  SmallVector<Operation *> worklist(roots);
  llvm::SmallPtrSet<Operation *, 16> erased;
  while (!worklist.empty()) {
    Operation *op = worklist.pop_back_val();
    if (!op || erased.contains(op) || !op->use_empty() || !isPure(op))
      continue;
    for (Value operand : op->getOperands())
      worklist.push_back(operand.getDefiningOp());
    erased.insert(op);
    op->erase();
  }
}

/// Replaces `first` and `second` by the results of `merged` (created at
/// `first`, which precedes `second`) and drops what they leave unused.
void replacePair(ReduceOp first, ReduceOp second, Operation *merged) {
  first.getResult().replaceAllUsesWith(merged->getResult(0));
  second.getResult().replaceAllUsesWith(merged->getResult(1));
  eraseDead({second.getOperation(), first.getOperation()});
}

/// sum(exp(x - max x)) -> max_sum_exp x.
bool mergeMaxSumExp(ReduceOp sum) {
  if (sum.getKind() != ReduceKind::Sum)
    return false;
  auto exp = sum.getInput().getDefiningOp<ExpOp>();
  ReduceOp max =
      exp ? centeringReduction(exp.getOperand(), ReduceKind::Max) : ReduceOp();
  if (!max)
    return false;
  OpBuilder b(max);
  auto merged = MaxSumExpOp::create(b, sum.getLoc(), max.getType(),
                                    max.getType(), max.getInput());
  replacePair(max, sum, merged);
  return true;
}

/// sum|mean((x - mean x)^2) -> moments sum|mean x.
bool mergeMoments(ReduceOp deviations) {
  auto square = deviations.getInput().getDefiningOp<MulOp>();
  if (!square || square.getLhs() != square.getRhs())
    return false;
  ReduceOp mean = centeringReduction(square.getLhs(), ReduceKind::Mean);
  if (!mean)
    return false;
  OpBuilder b(mean);
  auto merged =
      MomentsOp::create(b, deviations.getLoc(), mean.getType(), mean.getType(),
                        deviations.getKind(), mean.getInput());
  replacePair(mean, deviations, merged);
  return true;
}

/// `full` (a per-element value computed from full inputs and scalars) at
/// column 0 of each row: the inputs gathered there and its ops redone on
/// per-row values. Null where it reads a per-column input or a column
/// index.
Value atFirstColumn(OpBuilder &b, Value full, IRMapping &rowOf) {
  if (Value known = rowOf.lookupOrNull(full))
    return known;
  auto type = cast<ValueType>(full.getType());
  if (type.getKind() != ValueKind::Full)
    return full; // a scalar, or a per-row value
  Location loc = full.getLoc();
  Value row;
  if (isa<BlockArgument>(full)) {
    auto indexType =
        ValueType::get(b.getContext(), ValueKind::Scalar, b.getI32Type());
    Value zero = ConstantOp::create(b, loc, indexType, 0.0);
    Value column =
        BroadcastOp::create(b, loc, indexType.withKind(ValueKind::Row), zero);
    row = GatherOp::create(b, loc, type.withKind(ValueKind::Row), full, column);
  } else if (auto broadcast = full.getDefiningOp<BroadcastOp>()) {
    Value input = broadcast.getInput();
    ValueKind from = cast<ValueType>(input.getType()).getKind();
    if (from == ValueKind::Col)
      return {};
    row =
        from == ValueKind::Row
            ? input
            : BroadcastOp::create(b, loc, type.withKind(ValueKind::Row), input)
                  .getResult();
  } else {
    Operation *op = full.getDefiningOp();
    if (!(isa<CastOp>(op) || op->hasTrait<OpTrait::Elementwise>()) ||
        op->getNumResults() != 1)
      return {};
    IRMapping operands;
    for (Value operand : op->getOperands()) {
      Value value = atFirstColumn(b, operand, rowOf);
      if (!value)
        return {};
      operands.map(operand, value);
    }
    Operation *perRow = b.clone(*op, operands);
    perRow->getResult(0).setType(type.withKind(ValueKind::Row));
    row = perRow->getResult(0);
  }
  rowOf.map(full, row);
  return row;
}

/// The row reduction of `kind` over `input` the builder's insertion point
/// follows, or a new one there.
Value rowReductionOf(OpBuilder &b, ReduceKind kind, Value input) {
  for (Operation *user : input.getUsers())
    if (auto reduce = dyn_cast<ReduceOp>(user);
        reduce && reduce.isRowReduction() && reduce.getKind() == kind &&
        reduce->isBeforeInBlock(&*b.getInsertionPoint()))
      return reduce.getResult();
  auto type = cast<ValueType>(input.getType()).withKind(ValueKind::Row);
  return ReduceOp::create(b, input.getLoc(), type, kind, input);
}

/// sum|mean(a * (x - r)) -> sum|mean(a * (x - h)) - (r - h) * sum|mean(a),
/// where r is a per-row value a later pass than a's and x's gives (max x,
/// say) and h = x[row, 0]: the reduction moves to the pass that reduces
/// a and x. Centered on the row's first element, the terms stay the size
/// of the row's spread, not its offset (sum(a * x) - r * sum(a) loses the
/// digits of a large offset); an infinite or NaN first element centers on
/// 0 instead (-inf - -inf would be NaN where the unmerged form is -inf).
bool centerOnFirstColumn(ReduceOp reduce) {
  if (reduce.getKind() != ReduceKind::Sum &&
      reduce.getKind() != ReduceKind::Mean)
    return false;
  auto product = reduce.getInput().getDefiningOp<MulOp>();
  if (!product)
    return false;
  auto kernel = reduce->getParentOfType<KernelOp>();
  DenseMap<Value, int> levels = rowLevels(kernel);
  for (auto [centered, weight] :
       {std::pair(product.getLhs(), product.getRhs()),
        std::pair(product.getRhs(), product.getLhs())}) {
    auto sub = centered.getDefiningOp<SubOp>();
    auto center =
        sub ? sub.getRhs().getDefiningOp<BroadcastOp>() : BroadcastOp();
    if (!center || cast<ValueType>(center.getInput().getType()).getKind() !=
                       ValueKind::Row)
      continue;
    Value x = sub.getLhs(), r = center.getInput();
    if (levels.lookup(r) <= std::max(levels.lookup(x), levels.lookup(weight)))
      continue;
    OpBuilder b(reduce);
    Location loc = reduce.getLoc();
    IRMapping rowOf;
    Value head = atFirstColumn(b, x, rowOf);
    if (!head) {
      SmallVector<Operation *> partial;
      for (auto [full, row] : rowOf.getValueMap())
        partial.push_back(row.getDefiningOp());
      eraseDead(partial);
      continue;
    }
    auto rowType = cast<ValueType>(head.getType());
    auto fullType = rowType.withKind(ValueKind::Full);
    Value zero = BroadcastOp::create(
        b, loc, rowType,
        ConstantOp::create(b, loc, rowType.withKind(ValueKind::Scalar), 0.0));
    Value finite = CmpOp::create(
        b, loc, rowType.withElementType(b.getI1Type()), CmpPredicate::eq,
        SubOp::create(b, loc, rowType, head, head), zero);
    Value shift = SelectOp::create(b, loc, rowType, finite, head, zero);
    Value shifted = SubOp::create(b, loc, fullType, x,
                                  BroadcastOp::create(b, loc, fullType, shift));
    Value terms = MulOp::create(b, loc, fullType, weight, shifted);
    Value partial = ReduceOp::create(b, loc, rowType, reduce.getKind(), terms);
    Value weights = rowReductionOf(b, reduce.getKind(), weight);
    Value correction = MulOp::create(
        b, loc, rowType, SubOp::create(b, loc, rowType, r, shift), weights);
    Value merged = SubOp::create(b, loc, rowType, partial, correction);
    reduce.getResult().replaceAllUsesWith(merged);
    eraseDead({reduce.getOperation()});
    return true;
  }
  return false;
}

/// Merges `kernel`'s dependent row reductions; `center`: a weighted sum
/// about a later pass's row value too (centerOnFirstColumn).
void mergeRowReductions(KernelOp kernel, bool center) {
  SmallVector<ReduceOp> candidates;
  kernel.walk([&](ReduceOp reduce) {
    if (reduce.isRowReduction() && (reduce.getKind() == ReduceKind::Sum ||
                                    reduce.getKind() == ReduceKind::Mean))
      candidates.push_back(reduce);
  });
  // Centering first: the max it moves away from is then free to merge
  // with its sum of exp.
  if (center)
    llvm::erase_if(candidates, centerOnFirstColumn);
  for (ReduceOp reduce : candidates)
    if (!mergeMaxSumExp(reduce))
      mergeMoments(reduce);
}

/// Whether merging (not centering) leaves `kernel` one pass over its row
/// (tried on a copy).
bool mergesIntoOnePass(KernelOp kernel) {
  OwningOpRef<KernelOp> merged = kernel.clone();
  mergeRowReductions(*merged, /*center=*/false);
  return passLevels(*merged).size() == 1;
}

struct FuseMergeReductionsPass
    : tilefuse::impl::FuseMergeReductionsBase<FuseMergeReductionsPass> {
  void runOnOperation() override {
    KernelOp kernel = getOperation();
    bool onChip = false;
    if (kernel->hasAttr("fuse.tile")) {
      FailureOr<TileConfig> config = TileConfig::fromKernel(kernel);
      FailureOr<KernelShape> shape = getKernelShape(kernel);
      if (failed(config) || failed(shape))
        return signalPassFailure();
      onChip = config->rowOnChip;
      if (onChip &&
          (!keepsWideRowOnChip(*shape, *config) || !mergesIntoOnePass(kernel)))
        return;
    }
    // A row on chip is not centered: its second pass reads registers, and
    // the centered sum's subtraction and the online rescaling it lets merge
    // cost more than the registers merging frees (the soft-capped
    // probability-target forward at bf16 n = 8192: 85% -> 76% of HBM in
    // the traffic model).
    mergeRowReductions(kernel, /*center=*/!onChip);
  }
};

} // namespace
