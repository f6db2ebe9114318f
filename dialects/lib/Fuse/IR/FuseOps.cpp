//===- FuseOps.cpp - fuse ops: assembly, verifiers, folds -----------------===//

#include "tilefuse/Dialect/Fuse/IR/Fuse.h"

#include "mlir/Dialect/CommonFolders.h"
#include "mlir/IR/Builders.h"
#include "mlir/IR/Matchers.h"
#include "mlir/IR/PatternMatch.h"
#include "llvm/ADT/STLExtras.h"
#include "llvm/ADT/StringExtras.h"
#include "llvm/ADT/StringSet.h"

using namespace mlir;
using namespace tilefuse::fuse;

namespace {
/// Declarative canonicalizations (FuseCanonicalization.td) and the native
/// constraints they call.
bool isLosslessCastChain(Value innerInput, Value innerResult) {
  return isLosslessCast(cast<ValueType>(innerInput.getType()).getElementType(),
                        cast<ValueType>(innerResult.getType()).getElementType());
}
#include "FuseCanonicalization.inc"
} // namespace

static ValueType valueType(Value value) { return cast<ValueType>(value.getType()); }

//===----------------------------------------------------------------------===//
// Elementwise ops: `fuse.op %a, %b : T`, or `: (T0, T1) -> T` when the
// operand types differ from what the short form implies (invalid IR still
// prints and parses back, so its diagnostics can be tested).
//===----------------------------------------------------------------------===//

namespace {
/// The operand and result types that the short form `: T` stands for.
enum class ShortForm { AllSame, MaskResult, MaskFirstOperand };

void shortFormTypes(ShortForm form, ValueType type, size_t numOperands,
                    SmallVectorImpl<Type> &operandTypes, Type &resultType) {
  Type mask = type.withElementType(IntegerType::get(type.getContext(), 1));
  operandTypes.assign(numOperands, type);
  resultType = type;
  if (form == ShortForm::MaskResult)
    resultType = mask;
  if (form == ShortForm::MaskFirstOperand)
    operandTypes.front() = mask;
}

ParseResult parseValueOperands(OpAsmParser &parser, OperationState &result,
                               ShortForm form) {
  SmallVector<OpAsmParser::UnresolvedOperand> operands;
  SMLoc loc = parser.getCurrentLocation();
  if (parser.parseOperandList(operands) ||
      parser.parseOptionalAttrDict(result.attributes) || parser.parseColon())
    return failure();
  SmallVector<Type> operandTypes;
  Type resultType;
  if (succeeded(parser.parseOptionalLParen())) {
    if (parser.parseTypeList(operandTypes) || parser.parseRParen() ||
        parser.parseArrow() || parser.parseType(resultType))
      return failure();
  } else {
    ValueType type;
    if (parser.parseType(type))
      return failure();
    shortFormTypes(form, type, operands.size(), operandTypes, resultType);
  }
  result.addTypes(resultType);
  return parser.resolveOperands(operands, operandTypes, loc, result.operands);
}

void printValueOperands(OpAsmPrinter &printer, Operation *op, ShortForm form,
                        ValueType principal) {
  printer << ' ' << op->getOperands();
  printer.printOptionalAttrDict(op->getAttrs(), /*elidedAttrs=*/{"predicate"});
  printer << " : ";
  SmallVector<Type> operandTypes;
  Type resultType;
  shortFormTypes(form, principal, op->getNumOperands(), operandTypes,
                 resultType);
  if (TypeRange(operandTypes) == op->getOperandTypes() &&
      resultType == op->getResult(0).getType())
    printer << principal;
  else
    printer.printFunctionalType(op);
}

/// "operand #1 (per-row f32)".
std::string describeOperand(Operation *op, unsigned index) {
  ValueType type = valueType(op->getOperand(index));
  std::string text;
  llvm::raw_string_ostream os(text);
  os << "operand #" << index << " (" << describeKind(type.getKind()) << ' '
     << type.getElementType() << ')';
  return text;
}

/// Checks that operand `index` has exactly `expected`, with a message that
/// says which mismatch it is and how to fix it.
LogicalResult verifyOperandMatches(Operation *op, unsigned index,
                                   ValueType expected, StringRef expectedName) {
  ValueType actual = valueType(op->getOperand(index));
  if (actual.getKind() != expected.getKind())
    return op->emitOpError("kind mismatch: ")
           << describeOperand(op, index) << " is "
           << describeKind(actual.getKind()) << " but " << expectedName
           << " is " << describeKind(expected.getKind())
           << "; widen the narrower one with fuse.broadcast";
  if (actual.getElementType() != expected.getElementType())
    return op->emitOpError("element type mismatch: ")
           << describeOperand(op, index) << " has "
           << actual.getElementType() << " but " << expectedName << " has "
           << expected.getElementType() << "; convert with fuse.cast";
  return success();
}

LogicalResult verifyArithmeticElementType(Operation *op, ValueType type,
                                          bool floatOnly) {
  if (type.getElementType().isSignlessInteger(1))
    return op->emitOpError("does not take i1 masks; use fuse.select, or "
                           "fuse.cast the mask to a number first");
  if (floatOnly && !type.isFloat())
    return op->emitOpError("requires a floating-point element type, got ")
           << type.getElementType();
  return success();
}
} // namespace

static ParseResult parseElementwiseOp(OpAsmParser &parser,
                                      OperationState &result) {
  return parseValueOperands(parser, result, ShortForm::AllSame);
}

static void printElementwiseOp(OpAsmPrinter &printer, Operation *op) {
  printValueOperands(printer, op, ShortForm::AllSame,
                     valueType(op->getResult(0)));
}

static LogicalResult verifyElementwiseOp(Operation *op, bool floatOnly) {
  ValueType resultType = valueType(op->getResult(0));
  for (unsigned i = 0, e = op->getNumOperands(); i < e; ++i)
    if (failed(verifyOperandMatches(op, i, resultType, "the result")))
      return failure();
  return verifyArithmeticElementType(op, resultType, floatOnly);
}

#define GET_OP_CLASSES
#include "tilefuse/Dialect/Fuse/IR/FuseOps.cpp.inc"

//===----------------------------------------------------------------------===//
// KernelOp
//===----------------------------------------------------------------------===//

void KernelOp::build(OpBuilder &builder, OperationState &state, StringRef name,
                     ArrayRef<StringRef> inputNames, TypeRange inputTypes,
                     ArrayRef<StringRef> outputNames, TypeRange outputTypes) {
  state.addAttribute(getSymNameAttrName(state.name),
                     builder.getStringAttr(name));
  state.addAttribute(getFunctionTypeAttrName(state.name),
                     TypeAttr::get(builder.getFunctionType(inputTypes,
                                                           outputTypes)));
  state.addAttribute(getInputNamesAttrName(state.name),
                     builder.getStrArrayAttr(inputNames));
  state.addAttribute(getOutputNamesAttrName(state.name),
                     builder.getStrArrayAttr(outputNames));
  Block *entry = new Block();
  for (Type type : inputTypes)
    entry->addArgument(type, state.location);
  state.addRegion()->push_back(entry);
}

BlockArgument KernelOp::getInput(StringRef name) {
  for (auto [argName, arg] :
       llvm::zip(getInputNames().getAsValueRange<StringAttr>(),
                 getEntryBlock().getArguments()))
    if (argName == name)
      return arg;
  return {};
}

ParseResult KernelOp::parse(OpAsmParser &parser, OperationState &result) {
  Builder &builder = parser.getBuilder();
  StringAttr name;
  if (parser.parseSymbolName(name, getSymNameAttrName(result.name),
                             result.attributes))
    return failure();

  SmallVector<OpAsmParser::Argument> inputs;
  if (parser.parseArgumentList(inputs, OpAsmParser::Delimiter::Paren,
                               /*allowType=*/true))
    return failure();
  SmallVector<Attribute> inputNames;
  SmallVector<Type> inputTypes;
  for (OpAsmParser::Argument &input : inputs) {
    inputNames.push_back(
        builder.getStringAttr(input.ssaName.name.ltrim('%')));
    inputTypes.push_back(input.type);
  }

  SmallVector<Attribute> outputNames;
  SmallVector<Type> outputTypes;
  auto parseOutput = [&]() -> ParseResult {
    std::string outputName;
    Type type;
    if (parser.parseKeywordOrString(&outputName) || parser.parseColon() ||
        parser.parseType(type))
      return failure();
    outputNames.push_back(builder.getStringAttr(outputName));
    outputTypes.push_back(type);
    return success();
  };
  if (parser.parseArrow() ||
      parser.parseCommaSeparatedList(OpAsmParser::Delimiter::Paren,
                                     parseOutput) ||
      parser.parseOptionalAttrDictWithKeyword(result.attributes))
    return failure();

  result.addAttribute(getFunctionTypeAttrName(result.name),
                      TypeAttr::get(builder.getFunctionType(inputTypes,
                                                            outputTypes)));
  result.addAttribute(getInputNamesAttrName(result.name),
                      builder.getArrayAttr(inputNames));
  result.addAttribute(getOutputNamesAttrName(result.name),
                      builder.getArrayAttr(outputNames));
  return parser.parseRegion(*result.addRegion(), inputs);
}

void KernelOp::print(OpAsmPrinter &printer) {
  printer << ' ';
  printer.printSymbolName(getSymName());
  printer << '(';
  llvm::interleaveComma(getEntryBlock().getArguments(), printer,
                        [&](BlockArgument arg) {
                          printer.printRegionArgument(arg);
                        });
  printer << ") -> (";
  llvm::interleaveComma(
      llvm::zip(getOutputNames().getAsValueRange<StringAttr>(),
                getOutputTypes()),
      printer, [&](auto output) {
        printer.printKeywordOrString(std::get<0>(output));
        printer << ": " << std::get<1>(output);
      });
  printer << ')';
  printer.printOptionalAttrDictWithKeyword(
      (*this)->getAttrs(), {getSymNameAttrName(), getFunctionTypeAttrName(),
                            getInputNamesAttrName(), getOutputNamesAttrName()});
  printer << ' ';
  printer.printRegion(getBody(), /*printEntryBlockArgs=*/false);
}

void KernelOp::getAsmBlockArgumentNames(Region &region,
                                        OpAsmSetValueNameFn setNameFn) {
  for (auto [name, arg] :
       llvm::zip(getInputNames().getAsValueRange<StringAttr>(),
                 region.getArguments()))
    setNameFn(arg, name);
}

static bool isIdentifier(StringRef name) {
  if (name.empty() || !(llvm::isAlpha(name.front()) || name.front() == '_'))
    return false;
  return llvm::all_of(name, [](char c) { return llvm::isAlnum(c) || c == '_'; });
}

LogicalResult KernelOp::verify() {
  // The name becomes a PTX entry point, which takes no other characters
  // (the NVPTX backend aborts on them).
  if (!isIdentifier(getSymName()))
    return emitOpError("kernel name '")
           << getSymName() << "' is not an identifier ([A-Za-z_][A-Za-z0-9_]*)";
  FunctionType type = getFunctionType();
  if (getInputNames().size() != type.getNumInputs())
    return emitOpError("has ") << getInputNames().size()
                               << " input names for " << type.getNumInputs()
                               << " inputs";
  if (getOutputNames().size() != type.getNumResults())
    return emitOpError("has ") << getOutputNames().size()
                               << " output names for " << type.getNumResults()
                               << " outputs";
  if (type.getNumResults() == 0)
    return emitOpError("must declare at least one output");
  llvm::StringSet<> seen;
  for (ArrayAttr names : {getInputNames(), getOutputNames()}) {
    for (StringRef name : names.getAsValueRange<StringAttr>()) {
      if (!isIdentifier(name))
        return emitOpError("name '")
               << name << "' is not an identifier ([A-Za-z_][A-Za-z0-9_]*)";
      if (!seen.insert(name).second)
        return emitOpError("declares '")
               << name << "' twice; input and output names must be unique";
    }
  }
  for (auto [index, inputType] : llvm::enumerate(type.getInputs()))
    if (!isa<ValueType>(inputType))
      return emitOpError("input '")
             << cast<StringAttr>(getInputNames()[index]).getValue()
             << "' has type " << inputType << ", not a fuse value type";
  for (auto [index, outputType] : llvm::enumerate(type.getResults()))
    if (!isa<ValueType>(outputType))
      return emitOpError("output '")
             << cast<StringAttr>(getOutputNames()[index]).getValue()
             << "' has type " << outputType << ", not a fuse value type";
  return success();
}

LogicalResult KernelOp::verifyRegions() {
  if (getEntryBlock().getArgumentTypes() != getInputTypes())
    return emitOpError("entry block arguments do not match the declared "
                       "input types");
  return success();
}

LogicalResult YieldOp::verify() {
  auto kernel = cast<KernelOp>((*this)->getParentOp());
  ArrayRef<Type> outputTypes = kernel.getOutputTypes();
  if (getValues().size() != outputTypes.size())
    return emitOpError("yields ")
           << getValues().size() << " values but kernel @"
           << kernel.getSymName() << " declares " << outputTypes.size()
           << " outputs";
  for (auto [index, value, declared] :
       llvm::enumerate(getValues(), outputTypes))
    if (value.getType() != declared)
      return emitOpError("output #")
             << index << " '"
             << cast<StringAttr>(kernel.getOutputNames()[index]).getValue()
             << "' is declared " << declared << " but the yielded value is "
             << value.getType();
  return success();
}

//===----------------------------------------------------------------------===//
// Folds of elementwise arithmetic
//===----------------------------------------------------------------------===//

/// The float constant `attr` holds, if any.
static std::optional<APFloat> floatConstant(Attribute attr) {
  if (auto floatAttr = dyn_cast_or_null<FloatAttr>(attr))
    return floatAttr.getValue();
  return std::nullopt;
}

static bool isIntConstant(Attribute attr, int64_t value) {
  auto intAttr = dyn_cast_or_null<IntegerAttr>(attr);
  return intAttr && intAttr.getValue() == value;
}

OpFoldResult AddOp::fold(FoldAdaptor adaptor) {
  // x + -0.0 == x for every x; x + 0.0 is kept: it turns -0.0 into +0.0.
  std::optional<APFloat> rhs = floatConstant(adaptor.getRhs());
  if ((rhs && rhs->isNegZero()) || isIntConstant(adaptor.getRhs(), 0))
    return getLhs();
  if (Attribute folded = constFoldBinaryOp<FloatAttr, APFloat, void>(
          adaptor.getOperands(),
          [](const APFloat &a, const APFloat &b) { return a + b; }))
    return folded;
  return constFoldBinaryOp<IntegerAttr, APInt, void>(
      adaptor.getOperands(),
      [](const APInt &a, const APInt &b) { return a + b; });
}

OpFoldResult SubOp::fold(FoldAdaptor adaptor) {
  // x - 0.0 == x for every x (-0.0 - 0.0 is -0.0).
  std::optional<APFloat> rhs = floatConstant(adaptor.getRhs());
  if ((rhs && rhs->isPosZero()) || isIntConstant(adaptor.getRhs(), 0))
    return getLhs();
  if (Attribute folded = constFoldBinaryOp<FloatAttr, APFloat, void>(
          adaptor.getOperands(),
          [](const APFloat &a, const APFloat &b) { return a - b; }))
    return folded;
  return constFoldBinaryOp<IntegerAttr, APInt, void>(
      adaptor.getOperands(),
      [](const APInt &a, const APInt &b) { return a - b; });
}

OpFoldResult MulOp::fold(FoldAdaptor adaptor) {
  // x * 0 is not folded: NaN * 0 and Inf * 0 are NaN.
  std::optional<APFloat> rhs = floatConstant(adaptor.getRhs());
  if ((rhs && rhs->isExactlyValue(1.0)) || isIntConstant(adaptor.getRhs(), 1))
    return getLhs();
  if (Attribute folded = constFoldBinaryOp<FloatAttr, APFloat, void>(
          adaptor.getOperands(),
          [](const APFloat &a, const APFloat &b) { return a * b; }))
    return folded;
  return constFoldBinaryOp<IntegerAttr, APInt, void>(
      adaptor.getOperands(),
      [](const APInt &a, const APInt &b) { return a * b; });
}

OpFoldResult DivOp::fold(FoldAdaptor adaptor) {
  std::optional<APFloat> rhs = floatConstant(adaptor.getRhs());
  if ((rhs && rhs->isExactlyValue(1.0)) || isIntConstant(adaptor.getRhs(), 1))
    return getLhs();
  // Integer division is not constant-folded: a zero divisor must fail at
  // run time the way the target does, not at compile time.
  return constFoldBinaryOp<FloatAttr, APFloat, void>(
      adaptor.getOperands(),
      [](const APFloat &a, const APFloat &b) { return a / b; });
}

/// Folds a rounding op: a constant rounds exactly; rounding a value that is
/// already an integer (floor or round of something) changes nothing.
static OpFoldResult foldRounding(Operation *op, Attribute operand,
                                 llvm::RoundingMode mode) {
  if (std::optional<APFloat> value = floatConstant(operand)) {
    value->roundToIntegral(mode);
    return FloatAttr::get(valueType(op->getResult(0)).getElementType(),
                          *value);
  }
  Value input = op->getOperand(0);
  if (input.getDefiningOp<FloorOp>() || input.getDefiningOp<RoundOp>())
    return input;
  return {};
}

OpFoldResult FloorOp::fold(FoldAdaptor adaptor) {
  return foldRounding(*this, adaptor.getOperand(),
                      llvm::RoundingMode::TowardNegative);
}

OpFoldResult RoundOp::fold(FoldAdaptor adaptor) {
  return foldRounding(*this, adaptor.getOperand(),
                      llvm::RoundingMode::NearestTiesToEven);
}

void NegOp::getCanonicalizationPatterns(RewritePatternSet &patterns,
                                        MLIRContext *context) {
  patterns.add<DoubleNegation>(context);
}

//===----------------------------------------------------------------------===//
// CmpOp, SelectOp
//===----------------------------------------------------------------------===//

ParseResult CmpOp::parse(OpAsmParser &parser, OperationState &result) {
  StringRef keyword;
  SMLoc loc = parser.getCurrentLocation();
  if (parser.parseKeyword(&keyword))
    return failure();
  std::optional<CmpPredicate> predicate = symbolizeCmpPredicate(keyword);
  if (!predicate)
    return parser.emitError(loc, "unknown comparison '")
           << keyword << "': expected eq, ne, lt, le, gt or ge";
  result.addAttribute(getPredicateAttrName(result.name),
                      CmpPredicateAttr::get(parser.getContext(), *predicate));
  if (parser.parseComma())
    return failure();
  return parseValueOperands(parser, result, ShortForm::MaskResult);
}

void CmpOp::print(OpAsmPrinter &printer) {
  printer << ' ' << stringifyCmpPredicate(getPredicate()) << ',';
  printValueOperands(printer, *this, ShortForm::MaskResult,
                     valueType(getLhs()));
}

LogicalResult CmpOp::verify() {
  ValueType lhsType = valueType(getLhs());
  if (failed(verifyOperandMatches(*this, 1, lhsType, "operand #0")))
    return failure();
  ValueType resultType = getResult().getType();
  if (resultType.getKind() != lhsType.getKind() ||
      !resultType.getElementType().isSignlessInteger(1))
    return emitOpError("result must be an i1 mask of the operands' kind (")
           << lhsType.withElementType(IntegerType::get(getContext(), 1))
           << "), got " << resultType;
  return success();
}

ParseResult SelectOp::parse(OpAsmParser &parser, OperationState &result) {
  return parseValueOperands(parser, result, ShortForm::MaskFirstOperand);
}

void SelectOp::print(OpAsmPrinter &printer) {
  printValueOperands(printer, *this, ShortForm::MaskFirstOperand,
                     getResult().getType());
}

LogicalResult SelectOp::verify() {
  ValueType resultType = getResult().getType();
  ValueType conditionType = valueType(getCondition());
  if (!conditionType.getElementType().isSignlessInteger(1))
    return emitOpError("condition must be an i1 mask, got element type ")
           << conditionType.getElementType();
  if (conditionType.getKind() != resultType.getKind())
    return emitOpError("kind mismatch: the condition is ")
           << describeKind(conditionType.getKind()) << " but the result is "
           << describeKind(resultType.getKind())
           << "; widen the narrower one with fuse.broadcast";
  if (failed(verifyOperandMatches(*this, 1, resultType, "the result")) ||
      failed(verifyOperandMatches(*this, 2, resultType, "the result")))
    return failure();
  return success();
}

OpFoldResult SelectOp::fold(FoldAdaptor adaptor) {
  if (getTrueValue() == getFalseValue())
    return getTrueValue();
  if (auto condition = dyn_cast_or_null<IntegerAttr>(adaptor.getCondition()))
    return condition.getValue().isOne() ? getTrueValue() : getFalseValue();
  return {};
}

//===----------------------------------------------------------------------===//
// ConstantOp: `fuse.constant <kind> <typed attribute>`, e.g.
// `fuse.constant scalar 1.000000e+00 : f32`.
//===----------------------------------------------------------------------===//

void ConstantOp::build(OpBuilder &builder, OperationState &state,
                       ValueType type, double value) {
  Type elementType = type.getElementType();
  TypedAttr attr;
  if (isa<FloatType>(elementType))
    attr = builder.getFloatAttr(elementType, value);
  else
    attr = builder.getIntegerAttr(elementType, static_cast<int64_t>(value));
  build(builder, state, type, attr);
}

ParseResult ConstantOp::parse(OpAsmParser &parser, OperationState &result) {
  StringRef keyword;
  SMLoc loc = parser.getCurrentLocation();
  if (parser.parseKeyword(&keyword))
    return failure();
  std::optional<ValueKind> kind = symbolizeValueKind(keyword);
  if (!kind)
    return parser.emitError(loc, "expected a kind (full, row, col or "
                                 "scalar), got '")
           << keyword << "'";
  TypedAttr value;
  if (parser.parseAttribute(value, getValueAttrName(result.name),
                            result.attributes) ||
      parser.parseOptionalAttrDict(result.attributes))
    return failure();
  Type type = ValueType::getChecked([&] { return parser.emitError(loc); },
                                    parser.getContext(), *kind,
                                    value.getType());
  if (!type)
    return failure();
  result.addTypes(type);
  return success();
}

void ConstantOp::print(OpAsmPrinter &printer) {
  printer << ' ' << stringifyValueKind(getResult().getType().getKind()) << ' ';
  printer.printAttribute(getValue());
  printer.printOptionalAttrDict((*this)->getAttrs(), {getValueAttrName()});
}

LogicalResult ConstantOp::verify() {
  if (!isa<FloatAttr, IntegerAttr>(getValue()))
    return emitOpError("value must be a float or integer literal, got ")
           << getValue();
  Type elementType = getResult().getType().getElementType();
  if (getValue().getType() != elementType)
    return emitOpError("value of type ")
           << getValue().getType() << " does not match the element type "
           << elementType;
  return success();
}

OpFoldResult ConstantOp::fold(FoldAdaptor) { return getValue(); }

//===----------------------------------------------------------------------===//
// CastOp, BroadcastOp
//===----------------------------------------------------------------------===//

LogicalResult CastOp::verify() {
  ValueType from = valueType(getInput());
  ValueType to = getResult().getType();
  if (from.getKind() != to.getKind())
    return emitOpError("cannot change the kind (")
           << describeKind(from.getKind()) << " to "
           << describeKind(to.getKind())
           << "); use fuse.broadcast or fuse.reduce";
  if (to.getElementType().isSignlessInteger(1))
    return emitOpError("cannot cast to i1; compare with fuse.cmp instead");
  return success();
}

OpFoldResult CastOp::fold(FoldAdaptor) {
  if (getInput().getType() == getResult().getType())
    return getInput();
  return {};
}

void CastOp::getCanonicalizationPatterns(RewritePatternSet &patterns,
                                         MLIRContext *context) {
  patterns.add<LosslessCastChain>(context);
}

LogicalResult RoundToStorageOp::verify() {
  if (!valueType(getValue()).isFloat())
    return emitOpError("rounds a float value, got ")
           << valueType(getValue()).getElementType();
  auto input = dyn_cast<BlockArgument>(getInput());
  auto kernel = (*this)->getParentOfType<KernelOp>();
  ValueType inputType = valueType(getInput());
  if (!input || !kernel || input.getOwner() != &kernel.getEntryBlock() ||
      !inputType.isFloat() ||
      (inputType.getKind() != ValueKind::Full &&
       inputType.getKind() != ValueKind::Col))
    return emitOpError("'of' must name a full or per-column float input of "
                       "the kernel (a stored tensor)");
  return success();
}

LogicalResult BroadcastOp::verify() {
  ValueType from = valueType(getInput());
  ValueType to = getResult().getType();
  if (from.getElementType() != to.getElementType())
    return emitOpError("cannot change the element type (")
           << from.getElementType() << " to " << to.getElementType()
           << "); use fuse.cast";
  if (!canBroadcast(from.getKind(), to.getKind()))
    return emitOpError("cannot broadcast a ")
           << describeKind(from.getKind()) << " value to "
           << describeKind(to.getKind())
           << ": a broadcast widens scalar to any kind, or per-row and "
              "per-column to full";
  return success();
}

OpFoldResult BroadcastOp::fold(FoldAdaptor adaptor) {
  // A splat constant of the wider kind.
  if (adaptor.getInput())
    return adaptor.getInput();
  // broadcast(broadcast(x)) -> broadcast(x): the outer kind is wider still.
  if (auto inner = getInput().getDefiningOp<BroadcastOp>()) {
    getInputMutable().assign(inner.getInput());
    return getResult();
  }
  return {};
}

//===----------------------------------------------------------------------===//
// ReduceOp
//===----------------------------------------------------------------------===//

LogicalResult ReduceOp::verify() {
  ValueType input = valueType(getInput());
  ValueType result = getResult().getType();
  if (input.getKind() != ValueKind::Full)
    return emitOpError("cannot reduce a ")
           << describeKind(input.getKind())
           << " value: reductions take a full [rows, n] value";
  if (result.getKind() != ValueKind::Row && result.getKind() != ValueKind::Col)
    return emitOpError("result must be per-row (a row reduction) or "
                       "per-column (a column reduction), got ")
           << describeKind(result.getKind());
  if (input.getElementType() != result.getElementType())
    return emitOpError("result element type ")
           << result.getElementType() << " differs from the input's "
           << input.getElementType() << "; cast before reducing";
  if (input.getElementType().isSignlessInteger(1))
    return emitOpError("cannot reduce an i1 mask; fuse.cast it to a number "
                       "first");
  if (getKind() == ReduceKind::Mean && !input.isFloat())
    return emitOpError("mean requires a floating-point element type, got ")
           << input.getElementType();
  return success();
}

OpFoldResult ReduceOp::fold(FoldAdaptor) {
  // max/min/mean over copies of one value is that value.
  auto broadcast = getInput().getDefiningOp<BroadcastOp>();
  if (broadcast && getKind() != ReduceKind::Sum &&
      broadcast.getInput().getType() == getResult().getType())
    return broadcast.getInput();
  return {};
}

namespace {
/// sum over a row of a value broadcast along it is that value times n, and a
/// reduction of a broadcast scalar is a broadcast of the reduced scalar.
struct ReduceOfBroadcast : OpRewritePattern<ReduceOp> {
  using OpRewritePattern::OpRewritePattern;

  LogicalResult matchAndRewrite(ReduceOp op,
                                PatternRewriter &rewriter) const override {
    auto broadcast = op.getInput().getDefiningOp<BroadcastOp>();
    if (!broadcast)
      return failure();
    Value source = broadcast.getInput();
    ValueType sourceType = valueType(source);
    ValueType resultType = op.getResult().getType();
    bool fromScalar = sourceType.getKind() == ValueKind::Scalar;
    if (!fromScalar && sourceType != resultType)
      return failure();
    if (op.getKind() == ReduceKind::Sum) {
      // A column sum counts rows, which are only known at run time.
      if (!op.isRowReduction())
        return failure();
      Location loc = op.getLoc();
      Value n = RowLengthOp::create(
          rewriter, loc, sourceType.withKind(ValueKind::Scalar));
      if (!fromScalar)
        n = BroadcastOp::create(rewriter, loc, sourceType, n);
      source = MulOp::create(rewriter, loc, sourceType, source, n);
    } else if (!fromScalar) {
      return failure(); // Handled by the fold.
    }
    if (fromScalar)
      source = BroadcastOp::create(rewriter, op.getLoc(), resultType, source);
    rewriter.replaceOp(op, source);
    return success();
  }
};
} // namespace

void ReduceOp::getCanonicalizationPatterns(RewritePatternSet &patterns,
                                           MLIRContext *context) {
  patterns.add<ReduceOfBroadcast>(context);
}

//===----------------------------------------------------------------------===//
// GatherOp, IotaOp, RowLengthOp
//===----------------------------------------------------------------------===//

static bool isIndexType(Type type) {
  return type.isSignlessInteger(32) || type.isSignlessInteger(64);
}

LogicalResult GatherOp::verify() {
  ValueType source = valueType(getSource());
  ValueType index = valueType(getIndex());
  ValueType result = getResult().getType();
  if (source.getKind() != ValueKind::Full)
    return emitOpError("source must be full [rows, n], got ")
           << describeKind(source.getKind());
  if (index.getKind() != ValueKind::Row)
    return emitOpError("index must be per-row (one column per row), got ")
           << describeKind(index.getKind());
  if (!isIndexType(index.getElementType()))
    return emitOpError("index must have element type i32 or i64, got ")
           << index.getElementType();
  if (result != source.withKind(ValueKind::Row))
    return emitOpError("result must be ")
           << source.withKind(ValueKind::Row) << ", got " << result;
  return success();
}

LogicalResult ArgReduceOp::verify() {
  ValueType input = valueType(getInput());
  ValueType result = getResult().getType();
  if (getKind() != ReduceKind::Max && getKind() != ReduceKind::Min)
    return emitOpError("kind must be max or min, got ")
           << stringifyReduceKind(getKind());
  // Integers compare as signed; a mask (i1) would compare true below false.
  if (input.getKind() != ValueKind::Full || input.getElementType().isInteger(1))
    return emitOpError("input must be a full float or integer (not i1) "
                       "value, got ")
           << input;
  if (result.getKind() != ValueKind::Row ||
      !isIndexType(result.getElementType()))
    return emitOpError("result must be !fuse.row<i32> or !fuse.row<i64> (one "
                       "column per row), got ")
           << result;
  return success();
}

bool tilefuse::fuse::isRowReduction(Operation *op) {
  if (auto reduce = dyn_cast<ReduceOp>(op))
    return reduce.isRowReduction();
  return isa<ArgReduceOp, MaxSumExpOp, MaxDeviationOp, MomentsOp>(op);
}

/// A merged row reduction takes a full float value to per-row values of the
/// same element type.
static LogicalResult verifyMergedReduction(Operation *op) {
  ValueType input = valueType(op->getOperand(0));
  ValueType result = valueType(op->getResult(0));
  if (input.getKind() != ValueKind::Full || !input.isFloat())
    return op->emitOpError("input must be a full float value, got ") << input;
  if (result != input.withKind(ValueKind::Row))
    return op->emitOpError("results must be ")
           << input.withKind(ValueKind::Row) << ", got " << result;
  return success();
}

LogicalResult MaxSumExpOp::verify() {
  return verifyMergedReduction(getOperation());
}

LogicalResult MaxDeviationOp::verify() {
  return verifyMergedReduction(getOperation());
}

LogicalResult MomentsOp::verify() {
  if (getKind() != ReduceKind::Sum && getKind() != ReduceKind::Mean)
    return emitOpError("kind must be sum or mean, got ")
           << stringifyReduceKind(getKind());
  return verifyMergedReduction(getOperation());
}

OpFoldResult ArgReduceOp::fold(FoldAdaptor) {
  // Every column of a broadcast row holds the same value: the first wins.
  auto broadcast = getInput().getDefiningOp<BroadcastOp>();
  if (!broadcast)
    return {};
  return IntegerAttr::get(getResult().getType().getElementType(), 0);
}

LogicalResult IotaOp::verify() {
  ValueType result = getResult().getType();
  if (result.getKind() != ValueKind::Col ||
      !isIndexType(result.getElementType()))
    return emitOpError("yields the column index: its type must be "
                       "!fuse.col<i32> or !fuse.col<i64>, got ")
           << result;
  return success();
}

LogicalResult RowLengthOp::verify() {
  ValueType result = getResult().getType();
  if (result.getKind() != ValueKind::Scalar ||
      result.getElementType().isSignlessInteger(1))
    return emitOpError("yields n as a number: its type must be a scalar "
                       "float or integer, got ")
           << result;
  return success();
}
