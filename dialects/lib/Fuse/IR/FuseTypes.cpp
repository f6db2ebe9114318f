//===- FuseTypes.cpp - fuse value types and kinds -------------------------===//

#include "tilefuse/Dialect/Fuse/IR/Fuse.h"

#include "mlir/IR/DialectImplementation.h"

using namespace mlir;
using namespace tilefuse::fuse;

#include "tilefuse/Dialect/Fuse/IR/FuseEnums.cpp.inc"

#define GET_TYPEDEF_CLASSES
#include "tilefuse/Dialect/Fuse/IR/FuseTypes.cpp.inc"

void FuseDialect::registerTypes() {
  addTypes<
#define GET_TYPEDEF_LIST
#include "tilefuse/Dialect/Fuse/IR/FuseTypes.cpp.inc"
      >();
}

LogicalResult ValueType::verify(function_ref<InFlightDiagnostic()> emitError,
                                ValueKind kind, Type elementType) {
  if (elementType.isF16() || elementType.isBF16() || elementType.isF32() ||
      elementType.isF64() || elementType.isSignlessInteger(1) ||
      elementType.isSignlessInteger(32) || elementType.isSignlessInteger(64))
    return success();
  return emitError() << "unsupported element type " << elementType
                     << " for a " << describeKind(kind)
                     << " fuse value: expected f16, bf16, f32, f64, i1, i32 "
                        "or i64";
}

namespace tilefuse::fuse {

StringRef describeKind(ValueKind kind) {
  switch (kind) {
  case ValueKind::Full:
    return "full";
  case ValueKind::Row:
    return "per-row";
  case ValueKind::Col:
    return "per-column";
  case ValueKind::Scalar:
    return "scalar";
  }
  llvm_unreachable("unknown value kind");
}

bool canBroadcast(ValueKind from, ValueKind to) {
  if (from == to)
    return false;
  return from == ValueKind::Scalar || to == ValueKind::Full;
}

ValueKind joinKinds(ValueKind a, ValueKind b) {
  if (a == b || b == ValueKind::Scalar)
    return a;
  if (a == ValueKind::Scalar)
    return b;
  return ValueKind::Full;
}

static unsigned significandBits(FloatType type) {
  return llvm::APFloat::semanticsPrecision(type.getFloatSemantics());
}

static int maxExponent(FloatType type) {
  return llvm::APFloat::semanticsMaxExponent(type.getFloatSemantics());
}

bool isLosslessCast(Type from, Type to) {
  if (from == to)
    return true;
  if (from.isSignlessInteger(1))
    return true; // 0 and 1 fit everywhere.
  auto toFloat = dyn_cast<FloatType>(to);
  if (auto fromFloat = dyn_cast<FloatType>(from))
    return toFloat && significandBits(fromFloat) <= significandBits(toFloat) &&
           maxExponent(fromFloat) <= maxExponent(toFloat);
  // From a wider-than-i1 integer.
  if (toFloat)
    return from.getIntOrFloatBitWidth() < significandBits(toFloat);
  return to.isSignlessInteger() &&
         from.getIntOrFloatBitWidth() <= to.getIntOrFloatBitWidth();
}

} // namespace tilefuse::fuse
