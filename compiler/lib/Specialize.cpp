//===- Specialize.cpp - bind storage dtypes, n and alignment --------------===//

#include "tilefuse/Compiler/Passes.h"
#include "tilefuse/Compiler/TileConfig.h"

#include "mlir/IR/Builders.h"

namespace tilefuse {
#define GEN_PASS_DEF_FUSESPECIALIZE
#include "tilefuse/Compiler/Passes.h.inc"
} // namespace tilefuse

using namespace mlir;
using namespace tilefuse;
using namespace tilefuse::fuse;

namespace {

/// Tensors stored in the storage dtype: full and per-column floats.
bool isStoredInDtype(Type type) {
  auto value = cast<ValueType>(type);
  return value.isFloat() && (value.getKind() == ValueKind::Full ||
                             value.getKind() == ValueKind::Col);
}

Type parseDtype(MLIRContext *context, StringRef dtype) {
  Builder builder(context);
  if (dtype == "f32")
    return builder.getF32Type();
  if (dtype == "f16")
    return builder.getF16Type();
  if (dtype == "bf16")
    return builder.getBF16Type();
  if (dtype == "f64")
    return builder.getF64Type();
  return {};
}

/// The narrowest storage type of a full or per-column float port (it sets
/// the vector width), f32 if there is none.
Type narrowestStorage(KernelOp kernel) {
  Type narrowest = Float32Type::get(kernel.getContext());
  for (ArrayRef<Type> types : {kernel.getInputTypes(), kernel.getOutputTypes()})
    for (Type type : types)
      if (isStoredInDtype(type)) {
        Type element = cast<ValueType>(type).getElementType();
        if (element.getIntOrFloatBitWidth() < narrowest.getIntOrFloatBitWidth())
          narrowest = element;
      }
  return narrowest;
}

struct FuseSpecializePass
    : tilefuse::impl::FuseSpecializeBase<FuseSpecializePass> {
  using FuseSpecializeBase::FuseSpecializeBase;

  void runOnOperation() override {
    KernelOp kernel = getOperation();
    // "declared": every port keeps the type the fusion declares (the DSL
    // declares each tensor's own dtype).
    bool declared = dtype == "declared";
    Type storage =
        declared ? narrowestStorage(kernel) : parseDtype(&getContext(), dtype);
    if (!storage) {
      kernel.emitError("fuse-specialize: unsupported dtype '")
          << dtype << "': expected f32, f16, bf16, f64 or declared";
      return signalPassFailure();
    }
    if (n <= 0) {
      kernel.emitError("fuse-specialize: n must be positive, got ")
          << static_cast<int64_t>(n);
      return signalPassFailure();
    }
    if (n > kMaxRowLength) {
      kernel.emitError("fuse-specialize: n must be at most 2^40 = ")
          << kMaxRowLength << ", got " << static_cast<int64_t>(n);
      return signalPassFailure();
    }
    if (kernel->hasAttr("fuse.specialization")) {
      kernel.emitError("fuse-specialize: kernel @")
          << kernel.getSymName() << " is already specialized";
      return signalPassFailure();
    }

    OpBuilder builder(&getContext());
    Block &entry = kernel.getEntryBlock();
    builder.setInsertionPointToStart(&entry);
    SmallVector<Type> inputTypes;
    for (BlockArgument arg : entry.getArguments()) {
      auto computeType = cast<ValueType>(arg.getType());
      if (!declared && isStoredInDtype(computeType) &&
          computeType.getElementType() != storage) {
        arg.setType(computeType.withElementType(storage));
        auto widened = CastOp::create(builder, arg.getLoc(), computeType, arg);
        arg.replaceAllUsesExcept(widened, widened);
      }
      inputTypes.push_back(arg.getType());
    }

    auto yield = cast<YieldOp>(entry.getTerminator());
    builder.setInsertionPoint(yield);
    SmallVector<Type> outputTypes;
    for (OpOperand &operand : yield->getOpOperands()) {
      auto computeType = cast<ValueType>(operand.get().getType());
      if (!declared && isStoredInDtype(computeType) &&
          computeType.getElementType() != storage)
        operand.set(CastOp::create(builder, yield.getLoc(),
                                   computeType.withElementType(storage),
                                   operand.get()));
      outputTypes.push_back(operand.get().getType());
    }
    kernel.setFunctionType(builder.getFunctionType(inputTypes, outputTypes));

    kernel.walk([&](RowLengthOp op) {
      builder.setInsertionPoint(op);
      op.replaceAllUsesWith(ConstantOp::create(
          builder, op.getLoc(), op.getResult().getType(),
          static_cast<double>(n)).getResult());
      op.erase();
    });

    kernel->setAttr(
        "fuse.specialization",
        builder.getDictionaryAttr({
            builder.getNamedAttr("dtype", TypeAttr::get(storage)),
            builder.getNamedAttr("n", builder.getI64IntegerAttr(n)),
            builder.getNamedAttr("aligned", builder.getBoolAttr(aligned)),
        }));
  }
};

} // namespace
