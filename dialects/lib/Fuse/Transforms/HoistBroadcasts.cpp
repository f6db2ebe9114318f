//===- HoistBroadcasts.cpp - elementwise ops at the narrowest kind --------===//

#include "tilefuse/Dialect/Fuse/Transforms/Passes.h"

#include "mlir/IR/PatternMatch.h"
#include "mlir/Transforms/GreedyPatternRewriteDriver.h"

namespace tilefuse::fuse {
#define GEN_PASS_DEF_FUSEHOISTBROADCASTS
#include "tilefuse/Dialect/Fuse/Transforms/Passes.h.inc"
} // namespace tilefuse::fuse

using namespace mlir;
using namespace tilefuse::fuse;

namespace {

/// The value `operand` is a copy of at a narrower kind: the input of a
/// broadcast, or a constant (which is a splat of any kind). Null otherwise.
Value narrowSource(Value operand) {
  if (auto broadcast = operand.getDefiningOp<BroadcastOp>())
    return broadcast.getInput();
  if (operand.getDefiningOp<ConstantOp>())
    return operand;
  return {};
}

/// `value` at kind `kind` (which is at least as wide as its own when it is
/// not a constant).
Value atKind(PatternRewriter &rewriter, Location loc, Value value,
             ValueKind kind) {
  auto type = cast<ValueType>(value.getType());
  if (type.getKind() == kind)
    return value;
  if (auto constant = value.getDefiningOp<ConstantOp>())
    return ConstantOp::create(rewriter, loc, type.withKind(kind),
                              constant.getValue());
  return BroadcastOp::create(rewriter, loc, type.withKind(kind), value);
}

struct HoistElementwiseOverBroadcasts : RewritePattern {
  HoistElementwiseOverBroadcasts(MLIRContext *context)
      : RewritePattern(MatchAnyOpTypeTag(), /*benefit=*/1, context) {}

  LogicalResult matchAndRewrite(Operation *op,
                                PatternRewriter &rewriter) const override {
    if (!op->hasTrait<OpTrait::Elementwise>() || op->getNumResults() != 1 ||
        !isa<FuseDialect>(op->getDialect()))
      return failure();
    auto resultType = cast<ValueType>(op->getResult(0).getType());
    SmallVector<Value> sources;
    // Constants alone do not decide the kind: they fit any.
    std::optional<ValueKind> joined;
    for (Value operand : op->getOperands()) {
      Value source = narrowSource(operand);
      if (!source)
        return failure();
      sources.push_back(source);
      if (!source.getDefiningOp<ConstantOp>()) {
        ValueKind kind = cast<ValueType>(source.getType()).getKind();
        joined = joined ? joinKinds(*joined, kind) : kind;
      }
    }
    // All-constant operands are the folder's business.
    if (!joined || *joined == resultType.getKind())
      return failure();

    Location loc = op->getLoc();
    OperationState state(loc, op->getName(), {}, {op->getResultTypes()[0]},
                         op->getAttrs());
    for (Value source : sources)
      state.operands.push_back(atKind(rewriter, loc, source, *joined));
    state.types[0] = resultType.withKind(*joined);
    Operation *narrow = rewriter.create(state);
    rewriter.replaceOpWithNewOp<BroadcastOp>(op, resultType,
                                             narrow->getResult(0));
    return success();
  }
};

struct FuseHoistBroadcastsPass
    : tilefuse::fuse::impl::FuseHoistBroadcastsBase<FuseHoistBroadcastsPass> {
  void runOnOperation() override {
    RewritePatternSet patterns(&getContext());
    patterns.add<HoistElementwiseOverBroadcasts>(&getContext());
    if (failed(applyPatternsGreedily(getOperation(), std::move(patterns))))
      signalPassFailure();
  }
};

} // namespace
