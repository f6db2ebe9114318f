//===- LowerToCPU.cpp - fuse-lower-to-cpu ---------------------------------===//
//
// A row program on the CPU: a thread owns whole rows (CPURowMapping), the
// kernel and its finalize as func.func, and the pass, which lowers
// multi-tensor kernels too (LowerMultiTensor.cpp).
//
//===----------------------------------------------------------------------===//

#include "RowProgram.h"

#include "tilefuse/Compiler/Passes.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/Dialect/LLVMIR/LLVMDialect.h"

namespace tilefuse {
#define GEN_PASS_DEF_FUSELOWERTOCPU
#include "tilefuse/Compiler/Passes.h.inc"
} // namespace tilefuse

using namespace mlir;
using namespace tilefuse;
using namespace tilefuse::fuse;
using namespace tilefuse::lowering;

namespace tilefuse::lowering {

CPURowMapping::CPURowMapping(OpBuilder &b, Location loc)
    : zero(indexConstant(b, loc, 0)) {}

Value CPURowMapping::lane() { return zero; }

Value CPURowMapping::isRowLeader(OpBuilder &, Location) { return {}; }

SmallVector<ReductionState>
CPURowMapping::combineAcrossRow(OpBuilder &, Location, ArrayRef<RowReduction>,
                                ArrayRef<ReductionState> partials) {
  return SmallVector<ReductionState>(partials);
}

func::FuncOp createCPUEntry(OpBuilder &b, Location loc, KernelOp kernel,
                            SmallVector<Type> parameters) {
  parameters.append(4, b.getI64Type());
  auto function = func::FuncOp::create(b, loc, kernel.getSymName(),
                                       b.getFunctionType(parameters, {}));
  b.setInsertionPointToStart(function.addEntryBlock());
  return function;
}

Value trailingIndex(OpBuilder &b, Location loc, func::FuncOp function,
                    unsigned fromEnd) {
  return arith::IndexCastOp::create(
      b, loc, b.getIndexType(),
      function.getArgument(function.getNumArguments() - fromEnd));
}

static LogicalResult lowerKernelToCPU(KernelOp kernel, ModuleOp module) {
  FailureOr<TileConfig> config = TileConfig::fromKernel(kernel);
  FailureOr<KernelShape> shape = getKernelShape(kernel);
  if (failed(config) || failed(shape))
    return failure();
  if (config->isGPU())
    return kernel.emitError("kernel @")
           << kernel.getSymName() << " is tiled for " << config->target
           << ", not the CPU";
  MLIRContext *context = kernel.getContext();
  Location loc = kernel.getLoc();
  OpBuilder b(context);
  b.setInsertionPoint(kernel);
  Type pointer = LLVM::LLVMPointerType::get(context);

  FailureOr<KernelAbi> abi = getKernelAbi(kernel);
  if (failed(abi))
    return failure();
  // Then rows, row_begin, row_end, row_group.
  auto function =
      createCPUEntry(b, loc, kernel, loweredParameters(kernel, pointer, *abi));
  Block *entry = &function.front();
  Value rowBegin = trailingIndex(b, loc, function, 3),
        rowEnd = trailingIndex(b, loc, function, 2),
        rowGroup = trailingIndex(b, loc, function, 1);

  CPURowMapping mapping(b, loc);
  RowProgramEmitter emitter(kernel, *config, *shape, mapping, b);
  if (failed(emitter.checkSupported()))
    return failure();
  bindArguments(emitter, b, loc, kernel, *abi, entry->getArguments());
  emitter.emitPartialsInit(rowGroup);
  auto loop =
      scf::ForOp::create(b, loc, rowBegin, rowEnd, indexConstant(b, loc, 1));
  b.setInsertionPointToStart(loop.getBody());
  if (failed(emitter.emitRow(loop.getInductionVar(), Value(), rowGroup)))
    return failure();
  b.setInsertionPointToEnd(entry);
  func::ReturnOp::create(b, loc);

  if (columnReductions(kernel).empty())
    return success();
  b.setInsertionPointAfter(function);
  auto finalize = func::FuncOp::create(
      b, loc, (kernel.getSymName() + kFinalizeSuffix).str(),
      b.getFunctionType(finalizeParameters(kernel, pointer), {}));
  Block *finalizeEntry = finalize.addEntryBlock();
  b.setInsertionPointToStart(finalizeEntry);
  auto columns = scf::ForOp::create(b, loc, indexConstant(b, loc, 0),
                                    indexConstant(b, loc, shape->n),
                                    indexConstant(b, loc, 1));
  b.setInsertionPointToStart(columns.getBody());
  ValueRange arguments = finalizeEntry->getArguments();
  Value column = columns.getInductionVar();
  storeFinalized(b, loc, kernel, arguments, column,
                 combinePartials(b, loc, kernel, arguments, column, shape->n,
                                 indexConstant(b, loc, 0),
                                 finalizeRowGroups(b, loc, kernel, arguments),
                                 kMaxCpuPartialRows, /*group=*/1,
                                 /*freezeStart=*/false));
  b.setInsertionPointToEnd(finalizeEntry);
  func::ReturnOp::create(b, loc);
  return success();
}

} // namespace tilefuse::lowering

namespace {

struct FuseLowerToCPUPass
    : tilefuse::impl::FuseLowerToCPUBase<FuseLowerToCPUPass> {
  void runOnOperation() override {
    SmallVector<KernelOp> kernels(getOperation().getOps<KernelOp>());
    for (KernelOp kernel : kernels) {
      auto multiTensor = multiTensorKernel(kernel);
      if (failed(multiTensor) ||
          failed(*multiTensor
                     ? lowerMultiTensorKernelToCPU(
                           kernel, getOperation(), (*multiTensor)->config,
                           (*multiTensor)->shape, (*multiTensor)->abi)
                     : lowerKernelToCPU(kernel, getOperation())))
        return signalPassFailure();
      kernel.erase();
    }
  }
};

} // namespace
