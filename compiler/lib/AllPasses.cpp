//===- AllPasses.cpp - every pass the tools register ----------------------===//

#include "tilefuse/Compiler/Registration.h"

#include "mlir/Conversion/Passes.h"
#include "mlir/Dialect/GPU/Transforms/Passes.h"
#include "mlir/Transforms/Passes.h"

void tilefuse::registerAllPasses() {
  registerPipelinePasses();
  mlir::registerTransformsPasses();
  mlir::registerConversionPasses();
  mlir::registerGPUPasses();
}
