//===- FuseDialect.cpp - fuse dialect registration and type syntax --------===//

#include "tilefuse/Dialect/Fuse/IR/Fuse.h"

#include "mlir/IR/Builders.h"
#include "mlir/IR/DialectImplementation.h"
#include "llvm/ADT/TypeSwitch.h"

using namespace mlir;
using namespace tilefuse::fuse;

#include "tilefuse/Dialect/Fuse/IR/FuseDialect.cpp.inc"

void FuseDialect::initialize() {
  registerTypes();
  addOperations<
#define GET_OP_LIST
#include "tilefuse/Dialect/Fuse/IR/FuseOps.cpp.inc"
      >();
}

// Types are written `!fuse.<kind><<element type>>`, e.g. `!fuse.row<f32>`:
// the kind is the mnemonic, so the common case reads without noise.
Type FuseDialect::parseType(DialectAsmParser &parser) const {
  SMLoc loc = parser.getCurrentLocation();
  StringRef keyword;
  if (parser.parseKeyword(&keyword))
    return {};
  std::optional<ValueKind> kind = symbolizeValueKind(keyword);
  if (!kind) {
    parser.emitError(loc, "unknown fuse type '")
        << keyword << "': expected full, row, col or scalar";
    return {};
  }
  Type elementType;
  if (parser.parseLess() || parser.parseType(elementType) ||
      parser.parseGreater())
    return {};
  return ValueType::getChecked([&] { return parser.emitError(loc); },
                               getContext(), *kind, elementType);
}

void FuseDialect::printType(Type type, DialectAsmPrinter &printer) const {
  auto value = cast<ValueType>(type);
  printer << stringifyValueKind(value.getKind()) << '<'
          << value.getElementType() << '>';
}

Operation *FuseDialect::materializeConstant(OpBuilder &builder, Attribute value,
                                            Type type, Location loc) {
  auto valueType = dyn_cast<ValueType>(type);
  auto typed = dyn_cast<TypedAttr>(value);
  if (!valueType || !typed || typed.getType() != valueType.getElementType())
    return nullptr;
  return ConstantOp::create(builder, loc, valueType, typed);
}
