//===- LoweredSignature.cpp - a row program's lowered parameters ----------===//
//
// Shared by both targets: the lowered signature of a row program
// (KernelABI.h), and its arguments bound to the emitter.
//
//===----------------------------------------------------------------------===//

#include "RowProgram.h"

#include "mlir/Dialect/LLVMIR/LLVMDialect.h"
#include "llvm/ADT/StringSwitch.h"

using namespace mlir;
using namespace tilefuse;
using namespace tilefuse::fuse;

namespace tilefuse::lowering {

SmallVector<Type> loweredParameters(KernelOp kernel, Type pointer,
                                    const KernelAbi &abi) {
  SmallVector<Type> types;
  for (auto [name, input] :
       llvm::zip(kernel.getInputNames().getAsValueRange<StringAttr>(),
                 kernel.getInputTypes())) {
    auto type = cast<ValueType>(input);
    bool byValue = type.getKind() == ValueKind::Scalar &&
                   !abi.scalarPointers.count(name.str());
    types.push_back(byValue ? type.getElementType() : pointer);
  }
  for (size_t i = 0, e = kernel.getOutputTypes().size(); i < e; ++i)
    types.push_back(pointer);
  return types;
}

Type abiDtype(MLIRContext *context, StringRef name) {
  Builder b(context);
  return llvm::StringSwitch<Type>(name)
      .Case("f32", b.getF32Type())
      .Case("f16", b.getF16Type())
      .Case("bf16", b.getBF16Type())
      .Case("f64", b.getF64Type())
      .Case("i1", b.getI1Type())
      .Case("i32", b.getI32Type())
      .Default(b.getI64Type());
}

Value readScalar(OpBuilder &b, Location loc, KernelOp kernel, unsigned index,
                 Value address, Type pointee) {
  Value value = LLVM::LoadOp::create(b, loc, pointee, address);
  Type declared =
      cast<ValueType>(kernel.getInputTypes()[index]).getElementType();
  return convertElements(b, loc, value, declared);
}

void bindArguments(RowProgramEmitter &emitter, OpBuilder &b, Location loc,
                   KernelOp kernel, const KernelAbi &abi,
                   ValueRange arguments) {
  unsigned numInputs = kernel.getInputTypes().size();
  for (auto [index, name] :
       llvm::enumerate(kernel.getInputNames().getAsValueRange<StringAttr>())) {
    Value argument = arguments[index];
    if (auto it = abi.scalarPointers.find(name.str());
        it != abi.scalarPointers.end())
      argument = readScalar(b, loc, kernel, index, argument,
                            abiDtype(kernel.getContext(), it->second));
    emitter.bindInput(index, argument);
  }
  for (unsigned i = 0, e = kernel.getOutputTypes().size(); i < e; ++i)
    emitter.bindOutput(i, arguments[numInputs + i]);
}

} // namespace tilefuse::lowering
