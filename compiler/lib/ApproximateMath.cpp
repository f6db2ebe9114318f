//===- ApproximateMath.cpp - polynomial math for the CPU target -----------===//

#include "tilefuse/Compiler/Passes.h"

#include "mlir/Conversion/MathToLibm/MathToLibm.h"
#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"
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
    // flushes results below FLT_MIN (x < -87.7) to 0. log1p and expm1 use
    // Kahan's corrections around exp and (libm's) log.
    populateMathPolynomialApproximationPatterns(patterns, [](StringRef name) {
      return llvm::is_contained({math::ExpOp::getOperationName(),
                                 math::TanhOp::getOperationName(),
                                 math::ErfOp::getOperationName(),
                                 math::Log1pOp::getOperationName(),
                                 math::ExpM1Op::getOperationName()},
                                name);
    });
    if (failed(applyPatternsGreedily(getOperation(), std::move(patterns))))
      return signalPassFailure();

    // What the polynomials leave of log1p and expm1 (f64) goes to libm:
    // convert-math-to-llvm would compute them as log(1 + x) and exp(x) - 1,
    // which lose every digit for small x.
    SmallVector<Operation *> libmOps;
    getOperation()->walk([&](Operation *op) {
      if (isa<math::Log1pOp, math::ExpM1Op>(op))
        libmOps.push_back(op);
    });
    if (libmOps.empty())
      return;
    RewritePatternSet libm(&getContext());
    populateMathToLibmConversionPatterns(libm);
    GreedyRewriteConfig config;
    config.setStrictness(GreedyRewriteStrictness::ExistingAndNewOps);
    if (failed(applyOpPatternsGreedily(libmOps, std::move(libm), config)))
      signalPassFailure();
  }
};

} // namespace
