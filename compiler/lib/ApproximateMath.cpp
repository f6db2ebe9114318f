//===- ApproximateMath.cpp - polynomial math for the CPU target -----------===//

#include "tilefuse/Compiler/Passes.h"

#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/Math/IR/Math.h"
#include "mlir/Dialect/Math/Transforms/Passes.h"
#include "mlir/Dialect/Vector/IR/VectorOps.h"
#include "mlir/Transforms/GreedyPatternRewriteDriver.h"

namespace tilefuse {
#define GEN_PASS_DEF_FUSEAPPROXIMATEMATH
#include "tilefuse/Compiler/Passes.h.inc"
} // namespace tilefuse

using namespace mlir;

namespace {

struct FuseApproximateMathPass
    : tilefuse::impl::FuseApproximateMathBase<FuseApproximateMathPass> {
  void runOnOperation() override {
    RewritePatternSet patterns(&getContext());
    // Not log: its polynomial clamps inputs to FLT_MIN (log of a subnormal
    // would come out -87.3). Not rsqrt: its approximation needs AVX2. exp
    // flushes results below FLT_MIN (x < -87.7) to 0.
    populateMathPolynomialApproximationPatterns(patterns, [](StringRef name) {
      return llvm::is_contained({math::ExpOp::getOperationName(),
                                 math::TanhOp::getOperationName(),
                                 math::ErfOp::getOperationName()},
                                name);
    });
    if (failed(applyPatternsGreedily(getOperation(), std::move(patterns))))
      signalPassFailure();
  }
};

} // namespace
