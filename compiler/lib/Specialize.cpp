//===- Specialize.cpp - bind storage dtypes, n and alignment --------------===//

#include "tilefuse/Compiler/KernelABI.h"
#include "tilefuse/Compiler/Passes.h"

#include "mlir/IR/Builders.h"
#include "llvm/ADT/StringSet.h"

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

bool isScalarDtype(StringRef dtype) {
  return llvm::is_contained({"f32", "f16", "bf16", "f64", "i1", "i32", "i64"},
                            dtype);
}

/// Checks `abi` against the kernel's interface: names that exist and have
/// the right kinds, multi-tensor kernels elementwise over full tensors and
/// scalars.
LogicalResult checkAbi(KernelOp kernel, const KernelAbi &abi) {
  auto fail = [&](const Twine &message) -> LogicalResult {
    return kernel.emitError("fuse-specialize: ") << message;
  };
  llvm::StringMap<ValueKind> inputs, outputs;
  for (auto [name, type] : llvm::zip(
           kernel.getInputNames().getAsValueRange<StringAttr>(),
           kernel.getInputTypes()))
    inputs[name] = cast<ValueType>(type).getKind();
  for (auto [name, type] : llvm::zip(
           kernel.getOutputNames().getAsValueRange<StringAttr>(),
           kernel.getOutputTypes()))
    outputs[name] = cast<ValueType>(type).getKind();
  auto checkScalars = [&](const std::map<std::string, std::string> &scalars,
                          StringRef binding) -> LogicalResult {
    for (const auto &[name, dtype] : scalars) {
      auto it = inputs.find(name);
      if (it == inputs.end() || it->second != ValueKind::Scalar)
        return fail(binding + " '" + name + "' is not a scalar input of @" +
                    kernel.getSymName());
      if (!isScalarDtype(dtype))
        return fail(binding + " '" + name + "' has unsupported dtype '" +
                    dtype + "'");
    }
    return success();
  };
  if (failed(checkScalars(abi.scalarPointers, "pointer")) ||
      failed(checkScalars(abi.perTensorScalars, "per-tensor")))
    return failure();
  for (const auto &entry : abi.perTensorScalars)
    if (abi.scalarPointers.count(entry.first))
      return fail("scalar '" + entry.first +
                  "' is bound both by pointer and per tensor");
  if (!abi.multiTensor) {
    if (!abi.perTensorScalars.empty() || !abi.inplace.empty() ||
        !abi.skipIf.empty())
      return fail("per-tensor scalars, in-place outputs and skip-if need a "
                  "multi-tensor kernel");
    return success();
  }
  if (!abi.skipIf.empty() && !isScalarDtype(abi.skipIf))
    return fail("skip-if has unsupported dtype '" + abi.skipIf + "'");
  llvm::StringSet<> updated;
  for (const auto &[output, input] : abi.inplace) {
    auto out = outputs.find(output);
    auto in = inputs.find(input);
    if (out == outputs.end() || in == inputs.end())
      return fail("inplace:" + output + ":" + input + " names no output '" +
                  output + "' and input '" + input + "' of @" +
                  kernel.getSymName());
    if (!updated.insert(input).second)
      return fail("input '" + input + "' is updated by two outputs");
  }
  // Elementwise over full tensors and scalars: no row, column, reduction,
  // gather, iota or row length.
  auto checkKind = [&](StringRef name, ValueKind kind,
                       bool output) -> LogicalResult {
    if (kind == ValueKind::Full || (kind == ValueKind::Scalar && !output))
      return success();
    return fail(Twine("a multi-tensor kernel takes full tensors and scalars "
                      "and returns full tensors; '") +
                name + "' is " + stringifyValueKind(kind));
  };
  for (auto &entry : inputs)
    if (failed(checkKind(entry.getKey(), entry.getValue(), false)))
      return failure();
  for (auto &entry : outputs)
    if (failed(checkKind(entry.getKey(), entry.getValue(), true)))
      return failure();
  WalkResult walk = kernel.walk([&](Operation *op) {
    if (op == kernel.getOperation() || op->hasTrait<OpTrait::Elementwise>() ||
        isa<ConstantOp, CastOp, BroadcastOp, YieldOp>(op))
      return WalkResult::advance();
    op->emitError("fuse-specialize: a multi-tensor kernel is elementwise; ")
        << op->getName() << " is not";
    return WalkResult::interrupt();
  });
  return failure(walk.wasInterrupted());
}

struct FuseSpecializePass
    : tilefuse::impl::FuseSpecializeBase<FuseSpecializePass> {
  using FuseSpecializeBase::FuseSpecializeBase;

  void runOnOperation() override {
    KernelOp kernel = getOperation();
    Type storage = parseDtype(&getContext(), dtype);
    if (!storage) {
      kernel.emitError("fuse-specialize: unsupported dtype '")
          << dtype << "': expected f32, f16, bf16 or f64";
      return signalPassFailure();
    }
    std::optional<KernelAbi> parsedAbi = KernelAbi::parse(abi);
    if (!parsedAbi) {
      kernel.emitError("fuse-specialize: malformed abi '") << abi << "'";
      return signalPassFailure();
    }
    if (failed(checkAbi(kernel, *parsedAbi)))
      return signalPassFailure();
    if (parsedAbi->multiTensor && n != 0) {
      kernel.emitError("fuse-specialize: a multi-tensor kernel runs over "
                       "tensors of any size; n must be 0, got ")
          << static_cast<int64_t>(n);
      return signalPassFailure();
    }
    if (!parsedAbi->multiTensor && n <= 0) {
      kernel.emitError("fuse-specialize: n must be positive, got ")
          << static_cast<int64_t>(n);
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
      if (isStoredInDtype(computeType) &&
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
      if (isStoredInDtype(computeType) &&
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

    // In place: the output is stored where its input was read from.
    for (const auto &[output, input] : parsedAbi->inplace) {
      auto position = [](ArrayAttr names, StringRef name) {
        return llvm::find(names.getAsValueRange<StringAttr>(), name) -
               names.getAsValueRange<StringAttr>().begin();
      };
      Type outputType = outputTypes[position(kernel.getOutputNames(), output)];
      Type inputType = inputTypes[position(kernel.getInputNames(), input)];
      if (outputType != inputType) {
        kernel.emitError("fuse-specialize: output '")
            << output << "' (" << outputType << ") cannot update input '"
            << input << "' (" << inputType << ") in place";
        return signalPassFailure();
      }
    }

    SmallVector<NamedAttribute> fields = {
        builder.getNamedAttr("dtype", TypeAttr::get(storage)),
        builder.getNamedAttr("n", builder.getI64IntegerAttr(n)),
        builder.getNamedAttr("aligned", builder.getBoolAttr(aligned)),
    };
    if (!parsedAbi->isDefault())
      fields.push_back(
          builder.getNamedAttr("abi", builder.getStringAttr(parsedAbi->str())));
    kernel->setAttr("fuse.specialization", builder.getDictionaryAttr(fields));
  }
};

} // namespace
