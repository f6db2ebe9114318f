//===- Specialize.cpp - bind storage dtypes, n and alignment --------------===//

#include "tilefuse/Compiler/KernelABI.h"
#include "tilefuse/Compiler/Passes.h"
#include "tilefuse/Compiler/TileConfig.h"

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

/// The storage dtype of each stored port, from a spec "bf16" or
/// "bf16,exp_avg=f32,exp_avg_sq=f32": the default, then overrides by port
/// name (inputs and outputs). The default "declared" keeps each port's
/// declared type (the DSL declares each tensor's own dtype).
struct StorageSpec {
  Type defaultType; // null for "declared"
  llvm::StringMap<Type> overrides;

  /// The storage element type of the port `name` declared as `declared`.
  Type of(StringRef port, Type declared) const {
    auto it = overrides.find(port);
    if (it != overrides.end())
      return it->second;
    return defaultType ? defaultType
                       : cast<ValueType>(declared).getElementType();
  }
};

FailureOr<StorageSpec> parseStorageSpec(KernelOp kernel, StringRef spec) {
  SmallVector<StringRef> fields;
  spec.split(fields, ',');
  StorageSpec result;
  StringRef defaultDtype = fields.front().trim();
  if (defaultDtype != "declared") {
    result.defaultType = parseDtype(kernel.getContext(), defaultDtype);
    if (!result.defaultType)
      return kernel.emitError("fuse-specialize: unsupported dtype '")
             << defaultDtype << "': expected f32, f16, bf16, f64 or declared";
  }
  // The ports an override may name: stored (full or per-column float).
  llvm::StringSet<> stored;
  auto collect = [&](ArrayAttr names, ArrayRef<Type> types) {
    for (auto [name, type] : llvm::zip(names.getAsValueRange<StringAttr>(), types))
      if (isStoredInDtype(type))
        stored.insert(name);
  };
  collect(kernel.getInputNames(), kernel.getInputTypes());
  collect(kernel.getOutputNames(), kernel.getOutputTypes());
  for (StringRef field : llvm::drop_begin(fields)) {
    auto [name, dtype] = field.split('=');
    name = name.trim();
    Type type = parseDtype(kernel.getContext(), dtype.trim());
    if (!type)
      return kernel.emitError("fuse-specialize: '")
             << field << "': expected port=dtype with dtype f32, f16, bf16 "
             << "or f64";
    if (!stored.contains(name))
      return kernel.emitError("fuse-specialize: '")
             << field << "': kernel @" << kernel.getSymName()
             << " has no full or per-column float input or output named '"
             << name << "'";
    if (!result.overrides.try_emplace(name, type).second)
      return kernel.emitError("fuse-specialize: port '")
             << name << "' is given two storage dtypes";
  }
  return result;
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
        isa<ConstantOp, CastOp, BroadcastOp, RoundToStorageOp, YieldOp>(op))
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
    FailureOr<StorageSpec> storage = parseStorageSpec(kernel, dtype);
    if (failed(storage))
      return signalPassFailure();
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
    SmallVector<StringRef> inputNames(
        kernel.getInputNames().getAsValueRange<StringAttr>());
    auto storageOf = [&](BlockArgument arg) {
      return storage->of(inputNames[arg.getArgNumber()], arg.getType());
    };

    // Roundings to an input's storage, while the inputs are still the
    // block arguments they name.
    kernel.walk([&](RoundToStorageOp op) {
      Value value = op.getValue();
      auto type = cast<ValueType>(value.getType());
      Type stored = storageOf(cast<BlockArgument>(op.getInput()));
      if (type.getElementType() != stored) {
        builder.setInsertionPoint(op);
        value = CastOp::create(builder, op.getLoc(), type.withElementType(stored),
                               value);
        value = CastOp::create(builder, op.getLoc(), type, value);
      }
      op.replaceAllUsesWith(value);
      op.erase();
    });

    builder.setInsertionPointToStart(&entry);
    SmallVector<Type> inputTypes;
    for (BlockArgument arg : entry.getArguments()) {
      auto computeType = cast<ValueType>(arg.getType());
      Type stored = storageOf(arg);
      if (isStoredInDtype(computeType) &&
          computeType.getElementType() != stored) {
        arg.setType(computeType.withElementType(stored));
        auto widened = CastOp::create(builder, arg.getLoc(), computeType, arg);
        arg.replaceAllUsesExcept(widened, widened);
      }
      inputTypes.push_back(arg.getType());
    }

    auto yield = cast<YieldOp>(entry.getTerminator());
    builder.setInsertionPoint(yield);
    SmallVector<Type> outputTypes;
    for (auto [operand, name] :
         llvm::zip(yield->getOpOperands(),
                   kernel.getOutputNames().getAsValueRange<StringAttr>())) {
      auto computeType = cast<ValueType>(operand.get().getType());
      Type stored = storage->of(name, computeType);
      if (isStoredInDtype(computeType) &&
          computeType.getElementType() != stored)
        operand.set(CastOp::create(builder, yield.getLoc(),
                                   computeType.withElementType(stored),
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
        builder.getNamedAttr("dtype",
                             TypeAttr::get(storage->defaultType
                                               ? storage->defaultType
                                               : narrowestStorage(kernel))),
        builder.getNamedAttr("n", builder.getI64IntegerAttr(n)),
        builder.getNamedAttr("aligned", builder.getBoolAttr(aligned)),
    };
    if (!storage->overrides.empty()) {
      SmallVector<NamedAttribute> ports;
      for (const auto &entry : storage->overrides)
        ports.push_back(
            builder.getNamedAttr(entry.getKey(), TypeAttr::get(entry.getValue())));
      fields.push_back(
          builder.getNamedAttr("ports", builder.getDictionaryAttr(ports)));
    }
    if (!parsedAbi->isDefault())
      fields.push_back(
          builder.getNamedAttr("abi", builder.getStringAttr(parsedAbi->str())));
    kernel->setAttr("fuse.specialization", builder.getDictionaryAttr(fields));
  }
};

} // namespace
