//===- PredicatedLoad.cpp - PTX loads that move no bytes when off ---------===//

#include "PredicatedLoad.h"

#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/LLVMIR/LLVMDialect.h"
#include "mlir/Dialect/Vector/IR/VectorOps.h"
#include "llvm/ADT/StringExtras.h"
#include "llvm/Support/FormatVariadic.h"

#include <algorithm>
#include <cassert>
#include <limits>

using namespace mlir;

namespace {

/// One PTX load per `unitBytes` of a vector: 16- and 8-byte units as
/// `.v4`/`.v2` of 32-bit registers, smaller ones into one register (a byte
/// into a 16-bit one, PTX's narrowest).
struct VectorUnits {
  int64_t unitBytes, count, registersPerUnit;
  unsigned registerBits;
  std::string opcode;
};

VectorUnits vectorUnits(int64_t bytes, unsigned alignment) {
  VectorUnits units;
  units.unitBytes = std::min<int64_t>({bytes, alignment, 16});
  assert(llvm::isPowerOf2_64(units.unitBytes) && bytes % units.unitBytes == 0);
  units.count = bytes / units.unitBytes;
  units.registersPerUnit = std::max<int64_t>(1, units.unitBytes / 4);
  units.registerBits = units.unitBytes >= 4 ? 32 : 16;
  units.opcode =
      units.unitBytes > 4
          ? llvm::formatv("ld.global.v{0}.b32", units.registersPerUnit).str()
      : units.unitBytes == 4 ? "ld.global.b32"
      : units.unitBytes == 2 ? "ld.global.b16"
                             : "ld.global.u8";
  return units;
}

/// `@$predicate opcode destination, [$address+offset];` with registers
/// $first.. $(first + registers - 1) as the destination (a `{}` list of
/// several).
std::string loadInstruction(StringRef opcode, int64_t first, int64_t registers,
                            int64_t predicate, int64_t address,
                            int64_t offset) {
  SmallVector<std::string> names;
  for (int64_t r = first; r < first + registers; ++r)
    names.push_back("$" + std::to_string(r));
  std::string destination =
      registers == 1 ? names[0] : "{" + llvm::join(names, ", ") + "}";
  return llvm::formatv("@${0} {1} {2}, [${3}+{4}];", predicate, opcode,
                       destination, address, offset)
      .str();
}

} // namespace

Value tilefuse::predicatedLoad(OpBuilder &b, Location loc, Value base,
                               int64_t byteOffset, Value predicate,
                               Value otherwise, unsigned alignment,
                               bool mayMerge) {
  Type type = otherwise.getType();
  assert(byteOffset >= 0 && "predicated loads take non-negative offsets");
  // PTX's address offsets are signed 32-bit (those of a vector's last unit
  // too).
  auto vector = dyn_cast<VectorType>(type);
  int64_t bytes =
      vector ? vector.getNumElements() *
                   llvm::divideCeil(vector.getElementTypeBitWidth(), 8)
             : llvm::divideCeil(type.getIntOrFloatBitWidth(), 8);
  if (byteOffset + bytes > std::numeric_limits<int32_t>::max()) {
    base = LLVM::GEPOp::create(b, loc, base.getType(), b.getI8Type(), base,
                               ValueRange{LLVM::ConstantOp::create(
                                   b, loc, b.getI64Type(), byteOffset)});
    byteOffset = 0;
  }
  auto emit = [&](Type resultType, ValueRange tied, StringRef registerClass,
                  StringRef ptx) {
    std::string constraints;
    for (size_t i = 0; i < tied.size(); ++i)
      constraints += ("=" + registerClass + ",").str();
    constraints += "b,l";
    for (size_t i = 0; i < tied.size(); ++i)
      constraints += "," + std::to_string(i);
    SmallVector<Value> operands = {predicate, base};
    llvm::append_range(operands, tied);
    return LLVM::InlineAsmOp::create(
               b, loc, resultType, operands, ptx, constraints,
               /*has_side_effects=*/!mayMerge, /*is_align_stack=*/false,
               LLVM::tailcallkind::TailCallKind::None,
               LLVM::AsmDialectAttr::get(b.getContext(),
                                         LLVM::AsmDialect::AD_ATT),
               /*operand_attrs=*/ArrayAttr())
        .getResult(0);
  };

  if (!vector &&
      (type.getIntOrFloatBitWidth() == 8 ||
       (type.getIntOrFloatBitWidth() == 16 && isa<FloatType>(type)))) {
    // No 8-bit register class, and 16-bit floats through integer registers:
    // a vector of one.
    Value loaded =
        predicatedLoad(b, loc, base, byteOffset, predicate,
                       vector::BroadcastOp::create(
                           b, loc, VectorType::get({1}, type), otherwise),
                       alignment, mayMerge);
    return vector::ExtractOp::create(b, loc, loaded, 0);
  }
  if (!vector) {
    unsigned bits = type.getIntOrFloatBitWidth();
    assert((bits == 16 || bits == 32 || bits == 64) &&
           "scalar predicated loads are 8-, 16-, 32- or 64-bit");
    bool isFloat = isa<FloatType>(type);
    // NVPTX's inline-assembly register classes by width.
    StringRef registerClass = bits == 64   ? (isFloat ? "d" : "l")
                              : bits == 32 ? (isFloat ? "f" : "r")
                                           : "h";
    std::string opcode = llvm::formatv("ld.global.b{0}", bits).str();
    return emit(type, otherwise, registerClass,
                loadInstruction(opcode, 0, 1, 1, 2, byteOffset));
  }

  // A vector: loaded as integer registers, bit-cast back.
  VectorUnits units = vectorUnits(bytes, alignment);
  int64_t registers = units.count * units.registersPerUnit;
  Type memoryRegister =
      b.getIntegerType(units.unitBytes == 1 ? 8 : units.registerBits);
  Type registerType = b.getIntegerType(units.registerBits);
  Value asRegisters = vector::BitCastOp::create(
      b, loc, VectorType::get({registers}, memoryRegister), otherwise);
  SmallVector<Value> tied;
  for (int64_t i = 0; i < registers; ++i) {
    Value value = vector::ExtractOp::create(b, loc, asRegisters, i);
    if (memoryRegister != registerType)
      value = arith::ExtUIOp::create(b, loc, registerType, value);
    tied.push_back(value);
  }
  // Operands: the registers, then the predicate and the address.
  SmallVector<std::string> instructions;
  for (int64_t unit = 0; unit < units.count; ++unit)
    instructions.push_back(loadInstruction(
        units.opcode, unit * units.registersPerUnit, units.registersPerUnit,
        registers, registers + 1, byteOffset + unit * units.unitBytes));
  std::string ptx = llvm::join(instructions, "\n\t");
  SmallVector<Type> fields(registers, registerType);
  Type resultType =
      registers == 1 ? registerType
                     : LLVM::LLVMStructType::getLiteral(b.getContext(), fields);
  Value result =
      emit(resultType, tied, units.registerBits == 32 ? "r" : "h", ptx);
  SmallVector<Value> loaded;
  for (int64_t i = 0; i < registers; ++i) {
    Value value =
        registers == 1
            ? result
            : LLVM::ExtractValueOp::create(b, loc, result, i).getResult();
    if (memoryRegister != registerType)
      value = arith::TruncIOp::create(b, loc, memoryRegister, value);
    loaded.push_back(value);
  }
  Value packed = vector::FromElementsOp::create(
      b, loc, VectorType::get({registers}, memoryRegister), loaded);
  return vector::BitCastOp::create(b, loc, vector, packed);
}
