//===- tilefuse-opt.cpp - mlir-opt with tilefuse's dialects and passes ----===//

#include "tilefuse/Compiler/Registration.h"

#include "mlir/IR/DialectRegistry.h"
#include "mlir/Tools/mlir-opt/MlirOptMain.h"

int main(int argc, char **argv) {
  mlir::DialectRegistry registry;
  tilefuse::registerAllDialects(registry);
  tilefuse::registerAllPasses();
  return mlir::asMainReturnCode(mlir::MlirOptMain(
      argc, argv, "tilefuse optimizer driver\n", registry));
}
