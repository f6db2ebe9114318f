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
    // Only where libm is slow: on the scalars the row program computes,
    // glibc's expf and logf beat the polynomials (swiglu and softmax ran
    // ~2x slower with them), tanhf and erff lose to them (geglu ~4x
    // faster). Not rsqrt: its approximation needs AVX2.
    populateMathPolynomialApproximationPatterns(patterns, [](StringRef name) {
      return name == math::TanhOp::getOperationName() ||
             name == math::ErfOp::getOperationName();
    });
    if (failed(applyPatternsGreedily(getOperation(), std::move(patterns))))
      signalPassFailure();
  }
};

} // namespace
