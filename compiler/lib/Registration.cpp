//===- Registration.cpp - what tilefuse's tools register ------------------===//

#include "tilefuse/Compiler/Registration.h"

#include "tilefuse/Dialect/Fuse/IR/Fuse.h"
#include "tilefuse/Dialect/Fuse/Transforms/Passes.h"

#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/Dialect/Math/IR/Math.h"
#include "mlir/IR/DialectRegistry.h"
#include "mlir/Transforms/Passes.h"

void tilefuse::registerAllDialects(mlir::DialectRegistry &registry) {
  registry.insert<fuse::FuseDialect, mlir::arith::ArithDialect,
                  mlir::func::FuncDialect, mlir::math::MathDialect>();
}

void tilefuse::registerAllPasses() {
  fuse::registerFusePasses();
  mlir::registerTransformsPasses();
}
