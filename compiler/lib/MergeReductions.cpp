//===- MergeReductions.cpp - one pass over a streamed row -----------------===//
//
// Substitutes the one-pass forms of two dependent row reductions (see
// Passes.td): max then sum(exp(x - max)), max then sum(w * (x - max)) or
// sum(x - max), and mean then the sum or mean of (x - mean)^2. The lowering
// computes each merged op's state in the pass over its inputs' level.
//
//===----------------------------------------------------------------------===//

#include "tilefuse/Compiler/Passes.h"
#include "tilefuse/Compiler/TileConfig.h"

#include "mlir/Analysis/TopologicalSortUtils.h"
#include "llvm/ADT/MapVector.h"

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

/// sum(w * (x - max x)), w of x's pass or earlier, or sum(x - max x) (w = 1),
/// x float -> max_deviation x, w (created at `sum`, which w and x reach; the
/// max stays for its other uses, merged with its sum of exp or not). An
/// integer sum stays exact where it is.
bool mergeMaxDeviation(ReduceOp sum) {
  if (sum.getKind() != ReduceKind::Sum || !sum.getResult().getType().isFloat())
    return false;
  SmallVector<std::pair<Value, Value>, 2> centeredAndWeight;
  if (auto product = sum.getInput().getDefiningOp<MulOp>())
    centeredAndWeight = {{product.getLhs(), product.getRhs()},
                         {product.getRhs(), product.getLhs()}};
  else
    centeredAndWeight = {{sum.getInput(), Value()}};
  DenseMap<Value, int> levels = rowLevels(sum->getParentOfType<KernelOp>());
  for (auto [centered, weight] : centeredAndWeight) {
    ReduceOp max = centeringReduction(centered, ReduceKind::Max);
    if (!max ||
        (weight && levels.lookup(weight) > levels.lookup(max.getInput())))
      continue;
    OpBuilder b(sum);
    if (!weight)
      weight = ConstantOp::create(b, sum.getLoc(),
                                  cast<ValueType>(centered.getType()), 1.0);
    auto merged =
        MaxDeviationOp::create(b, sum.getLoc(), max.getType(), max.getType(),
                               max.getType(), max.getInput(), weight);
    sum.getResult().replaceAllUsesWith(merged.getDeviation());
    eraseDead({sum.getOperation()});
    return true;
  }
  return false;
}

/// A row sum of a max_deviation's weights in its pass (a loss's sum of
/// class weights or of weighted targets) is the deviation's sum of weights,
/// which its updates keep anyway. The sums are collected first (erasing
/// one during the walk freed the op the walk stood on), and the block is
/// then sorted again: the deviation stands where its sum about the max
/// stood, after some uses of the sum of weights.
void shareDeviationWeights(KernelOp kernel) {
  DenseMap<Value, int> levels = rowLevels(kernel);
  llvm::MapVector<ReduceOp, Value> weightSums;
  kernel.walk([&](MaxDeviationOp deviation) {
    Value weight = deviation.getWeight();
    if (levels.lookup(weight) != levels.lookup(deviation.getInput()))
      return;
    for (Operation *user : weight.getUsers())
      if (auto sum = dyn_cast<ReduceOp>(user);
          sum && sum.isRowReduction() && sum.getKind() == ReduceKind::Sum)
        weightSums.try_emplace(sum, deviation.getWeights());
  });
  if (weightSums.empty())
    return;
  for (auto [sum, weights] : weightSums) {
    sum.getResult().replaceAllUsesWith(weights);
    sum.erase();
  }
  bool sorted = sortTopologically(&kernel.getEntryBlock());
  assert(sorted && "a kernel's ops form no cycle");
  (void)sorted;
}

/// Merges `kernel`'s dependent row reductions.
void mergeRowReductions(KernelOp kernel) {
  SmallVector<ReduceOp> candidates;
  kernel.walk([&](ReduceOp reduce) {
    if (reduce.isRowReduction() && (reduce.getKind() == ReduceKind::Sum ||
                                    reduce.getKind() == ReduceKind::Mean))
      candidates.push_back(reduce);
  });
  // The sums about the max first: the max they no longer wait for is then
  // free to merge with its sum of exp.
  llvm::erase_if(candidates, mergeMaxDeviation);
  for (ReduceOp reduce : candidates)
    if (!mergeMaxSumExp(reduce))
      mergeMoments(reduce);
  shareDeviationWeights(kernel);
}

struct FuseMergeReductionsPass
    : tilefuse::impl::FuseMergeReductionsBase<FuseMergeReductionsPass> {
  void runOnOperation() override {
    KernelOp kernel = getOperation();
    if (kernel->hasAttr("fuse.tile")) {
      FailureOr<TileConfig> config = TileConfig::fromKernel(kernel);
      FailureOr<KernelShape> shape = getKernelShape(kernel);
      if (failed(config) || failed(shape))
        return signalPassFailure();
      // A wide row on chip merges where that leaves one pass, its sums
      // about the max included: the class-index losses' label smoothing
      // needs one (bf16 n = 32000 kept 62 elements a thread in 128
      // registers unmerged, 44% of HBM in the traffic model for the
      // weighted loss; merged, 40 registers and 75%). Where a row in 256
      // threads keeps logits and targets (the probability-target forwards
      // at bf16 n = 8192, forced: the rule gives them one warp a row), two
      // passes over registers took fewer instructions (soft-capped 85%
      // unmerged, 71% merged).
      if (config->rowOnChip &&
          (!keepsWideRowOnChip(*shape, *config) || !mergesIntoOnePass(kernel)))
        return;
    }
    mergeRowReductions(kernel);
  }
};

} // namespace

bool tilefuse::mergesIntoOnePass(KernelOp kernel) {
  OwningOpRef<KernelOp> merged = kernel.clone();
  mergeRowReductions(*merged);
  return passLevels(*merged).size() == 1;
}
