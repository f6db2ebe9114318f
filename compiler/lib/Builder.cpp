//===- Builder.cpp - the DSL's C++ builder --------------------------------===//

#include "tilefuse/Compiler/Builder.h"

#include "mlir/IR/Verifier.h"
#include "llvm/ADT/StringSwitch.h"

#include <cmath>

using namespace mlir;
using namespace tilefuse;
using namespace tilefuse::dsl;

namespace {
fuse::ValueType typeOf(dsl::Value value) {
  return llvm::cast<fuse::ValueType>(value.get().getType());
}

/// The element type both operands are computed in: a float over an integer,
/// the wider of two floats or two integers (torch's type promotion).
Type promote(Type lhs, Type rhs) {
  if (lhs == rhs)
    return lhs;
  bool lhsFloat = isa<FloatType>(lhs), rhsFloat = isa<FloatType>(rhs);
  if (lhsFloat != rhsFloat)
    return lhsFloat ? lhs : rhs;
  if (lhsFloat) {
    // bf16 with f16 has no exact common narrow type: compute in f32.
    unsigned lw = lhs.getIntOrFloatBitWidth(), rw = rhs.getIntOrFloatBitWidth();
    if (lw == rw)
      return Float32Type::get(lhs.getContext());
    return lw > rw ? lhs : rhs;
  }
  return lhs.getIntOrFloatBitWidth() >= rhs.getIntOrFloatBitWidth() ? lhs : rhs;
}

/// The element type an op on `lhs` and `rhs` computes in. A scalar against
/// a tensor (full, per row, per column) takes the tensor's type, as torch
/// treats Python numbers and 0-dim tensors: `x * beta` stays in x's type
/// however wide beta is (a float scalar against an integer tensor: the
/// fusion's compute type); otherwise promote().
Type operandType(dsl::Value lhs, dsl::Value rhs, Type compute) {
  Type l = typeOf(lhs).getElementType(), r = typeOf(rhs).getElementType();
  bool lhsScalar = lhs.kind() == Kind::Scalar;
  if (lhsScalar == (rhs.kind() == Kind::Scalar))
    return promote(l, r);
  Type tensor = lhsScalar ? r : l, scalar = lhsScalar ? l : r;
  if (isa<FloatType>(scalar) && !isa<FloatType>(tensor))
    return compute;
  return tensor;
}
} // namespace

Kind dsl::Value::kind() const { return typeOf(*this).getKind(); }

FusionBuilder::FusionBuilder(MLIRContext &context, StringRef name,
                             DType compute)
    : context(context), compute(compute), builder(&context), name(name.str()),
      body(new Block()) {
  context.getOrLoadDialect<fuse::FuseDialect>();
  module = ModuleOp::create(UnknownLoc::get(&context));
  builder.setInsertionPointToEnd(body);
}

Type FusionBuilder::elementType(DType dtype) {
  switch (dtype) {
  case DType::F32: return builder.getF32Type();
  case DType::F16: return builder.getF16Type();
  case DType::BF16: return builder.getBF16Type();
  case DType::F64: return builder.getF64Type();
  case DType::I1: return builder.getI1Type();
  case DType::I32: return builder.getI32Type();
  case DType::I64: return builder.getI64Type();
  }
  llvm_unreachable("unknown dtype");
}

dsl::Value FusionBuilder::input(StringRef inputName, Kind kind,
                                std::optional<DType> dtype) {
  Type type =
      fuse::ValueType::get(&context, kind, elementType(dtype.value_or(compute)));
  inputNames.push_back(inputName.str());
  inputTypes.push_back(type);
  return {this, body->addArgument(type, builder.getUnknownLoc())};
}

void FusionBuilder::output(StringRef outputName, dsl::Value value) {
  outputNames.push_back(outputName.str());
  outputs.push_back(value.get());
}

dsl::Value FusionBuilder::constant(double value, std::optional<DType> dtype) {
  auto type = fuse::ValueType::get(&context, Kind::Scalar,
                                   elementType(dtype.value_or(compute)));
  return {this, fuse::ConstantOp::create(builder, builder.getUnknownLoc(), type,
                                         value)};
}

dsl::Value FusionBuilder::scalar(double value, dsl::Value like) {
  auto type = typeOf(like).withKind(Kind::Scalar);
  if (type.getElementType().isInteger(1))
    type = type.withElementType(elementType(compute));
  return {this, fuse::ConstantOp::create(builder, builder.getUnknownLoc(), type,
                                         value)};
}

dsl::Value FusionBuilder::rowLength(std::optional<DType> dtype) {
  auto type = fuse::ValueType::get(&context, Kind::Scalar,
                                   elementType(dtype.value_or(compute)));
  return {this, fuse::RowLengthOp::create(builder, builder.getUnknownLoc(), type)};
}

dsl::Value FusionBuilder::iota(DType dtype) {
  auto type = fuse::ValueType::get(&context, Kind::Col, elementType(dtype));
  return {this, fuse::IotaOp::create(builder, builder.getUnknownLoc(), type)};
}

dsl::Value FusionBuilder::castTo(dsl::Value x, Type elementType) {
  fuse::ValueType type = typeOf(x);
  if (type.getElementType() == elementType)
    return x;
  return {this, fuse::CastOp::create(builder, builder.getUnknownLoc(),
                                     type.withElementType(elementType),
                                     x.get())};
}

dsl::Value FusionBuilder::broadcastTo(dsl::Value x, Kind kind) {
  fuse::ValueType type = typeOf(x);
  if (type.getKind() == kind)
    return x;
  return {this, fuse::BroadcastOp::create(builder, builder.getUnknownLoc(),
                                          type.withKind(kind), x.get())};
}

dsl::Value FusionBuilder::binary(StringRef op, dsl::Value lhs, dsl::Value rhs) {
  Type element = operandType(lhs, rhs, elementType(compute));
  Kind kind = fuse::joinKinds(lhs.kind(), rhs.kind());
  mlir::Value a = broadcastTo(castTo(lhs, element), kind).get();
  mlir::Value b = broadcastTo(castTo(rhs, element), kind).get();
  Type type = typeOf({this, a});
  Location loc = builder.getUnknownLoc();
  mlir::Value result =
      llvm::StringSwitch<std::function<mlir::Value()>>(op)
          .Case("add", [&] { return fuse::AddOp::create(builder, loc, type, a, b).getResult(); })
          .Case("sub", [&] { return fuse::SubOp::create(builder, loc, type, a, b).getResult(); })
          .Case("mul", [&] { return fuse::MulOp::create(builder, loc, type, a, b).getResult(); })
          .Case("div", [&] { return fuse::DivOp::create(builder, loc, type, a, b).getResult(); })
          .Case("pow", [&] { return fuse::PowOp::create(builder, loc, type, a, b).getResult(); })
          .Case("maximum", [&] { return fuse::MaximumOp::create(builder, loc, type, a, b).getResult(); })
          .Case("minimum", [&] { return fuse::MinimumOp::create(builder, loc, type, a, b).getResult(); })
          .Default([] { return mlir::Value(); })();
  assert(result && "unknown binary op");
  return {this, result};
}

dsl::Value FusionBuilder::unary(StringRef op, dsl::Value x) {
  Type type = x.get().getType();
  Location loc = builder.getUnknownLoc();
  mlir::Value v = x.get();
  mlir::Value result =
      llvm::StringSwitch<std::function<mlir::Value()>>(op)
          .Case("neg", [&] { return fuse::NegOp::create(builder, loc, type, v).getResult(); })
          .Case("abs", [&] { return fuse::AbsOp::create(builder, loc, type, v).getResult(); })
          .Case("exp", [&] { return fuse::ExpOp::create(builder, loc, type, v).getResult(); })
          .Case("log", [&] { return fuse::LogOp::create(builder, loc, type, v).getResult(); })
          .Case("sqrt", [&] { return fuse::SqrtOp::create(builder, loc, type, v).getResult(); })
          .Case("rsqrt", [&] { return fuse::RsqrtOp::create(builder, loc, type, v).getResult(); })
          .Case("tanh", [&] { return fuse::TanhOp::create(builder, loc, type, v).getResult(); })
          .Case("erf", [&] { return fuse::ErfOp::create(builder, loc, type, v).getResult(); })
          .Case("sigmoid", [&] { return fuse::SigmoidOp::create(builder, loc, type, v).getResult(); })
          .Case("log1p", [&] { return fuse::Log1pOp::create(builder, loc, type, v).getResult(); })
          .Case("expm1", [&] { return fuse::Expm1Op::create(builder, loc, type, v).getResult(); })
          .Case("sin", [&] { return fuse::SinOp::create(builder, loc, type, v).getResult(); })
          .Case("cos", [&] { return fuse::CosOp::create(builder, loc, type, v).getResult(); })
          .Case("floor", [&] { return fuse::FloorOp::create(builder, loc, type, v).getResult(); })
          .Case("round", [&] { return fuse::RoundOp::create(builder, loc, type, v).getResult(); })
          .Default([] { return mlir::Value(); })();
  assert(result && "unknown unary op");
  return {this, result};
}

dsl::Value FusionBuilder::compare(fuse::CmpPredicate predicate, dsl::Value lhs,
                                  dsl::Value rhs) {
  Type element = operandType(lhs, rhs, elementType(compute));
  Kind kind = fuse::joinKinds(lhs.kind(), rhs.kind());
  mlir::Value a = broadcastTo(castTo(lhs, element), kind).get();
  mlir::Value b = broadcastTo(castTo(rhs, element), kind).get();
  auto type = llvm::cast<fuse::ValueType>(a.getType()).withElementType(builder.getI1Type());
  return {this, fuse::CmpOp::create(builder, builder.getUnknownLoc(), type,
                                    predicate, a, b)};
}

dsl::Value FusionBuilder::select(dsl::Value condition, dsl::Value a,
                                 dsl::Value b) {
  Type element = operandType(a, b, elementType(compute));
  Kind kind = fuse::joinKinds(condition.kind(), fuse::joinKinds(a.kind(), b.kind()));
  mlir::Value c = broadcastTo(condition, kind).get();
  mlir::Value x = broadcastTo(castTo(a, element), kind).get();
  mlir::Value y = broadcastTo(castTo(b, element), kind).get();
  return {this, fuse::SelectOp::create(builder, builder.getUnknownLoc(),
                                       x.getType(), c, x, y)};
}

dsl::Value FusionBuilder::fma(dsl::Value a, dsl::Value b, dsl::Value c) {
  Type element = promote(promote(typeOf(a).getElementType(),
                                 typeOf(b).getElementType()),
                         typeOf(c).getElementType());
  Kind kind = fuse::joinKinds(fuse::joinKinds(a.kind(), b.kind()), c.kind());
  auto operand = [&](dsl::Value v) {
    return broadcastTo(castTo(v, element), kind).get();
  };
  mlir::Value x = operand(a), y = operand(b), z = operand(c);
  return {this, fuse::FmaOp::create(builder, builder.getUnknownLoc(),
                                    x.getType(), x, y, z)};
}

dsl::Value FusionBuilder::roundToStorageOf(dsl::Value x, dsl::Value input) {
  return {this, fuse::RoundToStorageOp::create(builder, builder.getUnknownLoc(),
                                               x.get().getType(), x.get(),
                                               input.get())};
}

dsl::Value FusionBuilder::reduce(fuse::ReduceKind kind, dsl::Value x,
                                 Kind resultKind) {
  auto type = typeOf(x).withKind(resultKind);
  return {this, fuse::ReduceOp::create(builder, builder.getUnknownLoc(), type,
                                       kind, x.get())};
}

dsl::Value FusionBuilder::sum(dsl::Value x) { return reduce(fuse::ReduceKind::Sum, x, Kind::Row); }
dsl::Value FusionBuilder::max(dsl::Value x) { return reduce(fuse::ReduceKind::Max, x, Kind::Row); }
dsl::Value FusionBuilder::min(dsl::Value x) { return reduce(fuse::ReduceKind::Min, x, Kind::Row); }
dsl::Value FusionBuilder::mean(dsl::Value x) { return reduce(fuse::ReduceKind::Mean, x, Kind::Row); }
dsl::Value FusionBuilder::columnSum(dsl::Value x) { return reduce(fuse::ReduceKind::Sum, x, Kind::Col); }
dsl::Value FusionBuilder::columnMax(dsl::Value x) { return reduce(fuse::ReduceKind::Max, x, Kind::Col); }
dsl::Value FusionBuilder::columnMin(dsl::Value x) { return reduce(fuse::ReduceKind::Min, x, Kind::Col); }
dsl::Value FusionBuilder::columnMean(dsl::Value x) { return reduce(fuse::ReduceKind::Mean, x, Kind::Col); }

dsl::Value FusionBuilder::argReduce(fuse::ReduceKind kind, dsl::Value x) {
  auto type = typeOf(x).withKind(Kind::Row).withElementType(builder.getI64Type());
  return {this, fuse::ArgReduceOp::create(builder, builder.getUnknownLoc(), type,
                                          kind, x.get())};
}

dsl::Value FusionBuilder::argmax(dsl::Value x) { return argReduce(fuse::ReduceKind::Max, x); }
dsl::Value FusionBuilder::argmin(dsl::Value x) { return argReduce(fuse::ReduceKind::Min, x); }

dsl::Value FusionBuilder::gather(dsl::Value source, dsl::Value index) {
  auto type = typeOf(source).withKind(Kind::Row);
  return {this, fuse::GatherOp::create(builder, builder.getUnknownLoc(), type,
                                       source.get(), index.get())};
}

FailureOr<OwningOpRef<ModuleOp>> FusionBuilder::finish() {
  fuse::YieldOp::create(builder, builder.getUnknownLoc(), outputs);
  SmallVector<Type> outputTypes;
  for (mlir::Value output : outputs)
    outputTypes.push_back(output.getType());
  SmallVector<StringRef> inputs(inputNames.begin(), inputNames.end());
  SmallVector<StringRef> outs(outputNames.begin(), outputNames.end());
  OpBuilder moduleBuilder = OpBuilder::atBlockEnd(module->getBody());
  auto kernel = fuse::KernelOp::create(moduleBuilder, module->getLoc(), name,
                                       inputs, inputTypes, outs, outputTypes);
  // The kernel's body is the block the values were built in.
  kernel.getBody().front().erase();
  kernel.getBody().push_back(body);
  if (failed(verify(*module)))
    return failure();
  return std::move(module);
}

// The free functions: everything goes through the owning builder.
namespace tilefuse::dsl {
static FusionBuilder &ownerOf(Value a) { return *a.owner(); }

Value operator+(Value l, Value r) { return ownerOf(l).binary("add", l, r); }
Value operator-(Value l, Value r) { return ownerOf(l).binary("sub", l, r); }
Value operator*(Value l, Value r) { return ownerOf(l).binary("mul", l, r); }
Value operator/(Value l, Value r) { return ownerOf(l).binary("div", l, r); }
Value operator-(Value x) { return ownerOf(x).unary("neg", x); }
Value operator+(Value l, double r) { return l + ownerOf(l).scalar(r, l); }
Value operator-(Value l, double r) { return l - ownerOf(l).scalar(r, l); }
Value operator*(Value l, double r) { return l * ownerOf(l).scalar(r, l); }
Value operator/(Value l, double r) { return l / ownerOf(l).scalar(r, l); }
Value operator+(double l, Value r) { return ownerOf(r).scalar(l, r) + r; }
Value operator-(double l, Value r) { return ownerOf(r).scalar(l, r) - r; }
Value operator*(double l, Value r) { return ownerOf(r).scalar(l, r) * r; }
Value operator/(double l, Value r) { return ownerOf(r).scalar(l, r) / r; }
Value operator<(Value l, Value r) { return ownerOf(l).compare(fuse::CmpPredicate::lt, l, r); }
Value operator<=(Value l, Value r) { return ownerOf(l).compare(fuse::CmpPredicate::le, l, r); }
Value operator>(Value l, Value r) { return ownerOf(l).compare(fuse::CmpPredicate::gt, l, r); }
Value operator>=(Value l, Value r) { return ownerOf(l).compare(fuse::CmpPredicate::ge, l, r); }
Value operator==(Value l, Value r) { return ownerOf(l).compare(fuse::CmpPredicate::eq, l, r); }
Value operator!=(Value l, Value r) { return ownerOf(l).compare(fuse::CmpPredicate::ne, l, r); }

Value exp(Value x) { return ownerOf(x).unary("exp", x); }
Value log(Value x) { return ownerOf(x).unary("log", x); }
Value sqrt(Value x) { return ownerOf(x).unary("sqrt", x); }
Value rsqrt(Value x) { return ownerOf(x).unary("rsqrt", x); }
Value tanh(Value x) { return ownerOf(x).unary("tanh", x); }
Value erf(Value x) { return ownerOf(x).unary("erf", x); }
Value abs(Value x) { return ownerOf(x).unary("abs", x); }
Value sigmoid(Value x) { return ownerOf(x).unary("sigmoid", x); }
Value log1p(Value x) { return ownerOf(x).unary("log1p", x); }
Value expm1(Value x) { return ownerOf(x).unary("expm1", x); }
Value sin(Value x) { return ownerOf(x).unary("sin", x); }
Value cos(Value x) { return ownerOf(x).unary("cos", x); }
Value floor(Value x) { return ownerOf(x).unary("floor", x); }
Value round(Value x) { return ownerOf(x).unary("round", x); }
Value silu(Value x) { return x * sigmoid(x); }
Value gelu(Value x, llvm::StringRef approximate) {
  if (approximate == "tanh") {
    double k = std::sqrt(2.0 / M_PI);
    return 0.5 * x * (1.0 + tanh(k * (x + 0.044715 * x * x * x)));
  }
  return 0.5 * x * (1.0 + erf(x * M_SQRT1_2));
}
Value pow(Value b, Value e) { return ownerOf(b).binary("pow", b, e); }
Value pow(Value b, double e) { return pow(b, ownerOf(b).scalar(e, b)); }
Value fma(Value a, Value b, Value c) { return ownerOf(a).fma(a, b, c); }
Value roundToStorageOf(Value x, Value input) {
  return ownerOf(x).roundToStorageOf(x, input);
}
Value maximum(Value l, Value r) { return ownerOf(l).binary("maximum", l, r); }
Value minimum(Value l, Value r) { return ownerOf(l).binary("minimum", l, r); }
Value where(Value c, Value a, Value b) { return ownerOf(c).select(c, a, b); }
Value cast(Value x, DType dtype) {
  return ownerOf(x).castTo(x, ownerOf(x).elementType(dtype));
}

Value sign(Value x) {
  FusionBuilder &b = ownerOf(x);
  Type type = typeOf(x).getElementType();
  Value zero = b.scalar(0, x);
  return b.castTo(x > zero, type) - b.castTo(x < zero, type);
}

Value relu(Value x) {
  // x * 0 keeps -0.0 and NaN where torch.relu does.
  Value zero = ownerOf(x).scalar(0, x);
  return where(x > zero, x, where(x < zero, zero, x * zero));
}

Value square(Value x) { return x * x; }

Value clamp(Value x, std::optional<Value> min, std::optional<Value> max) {
  if (min)
    x = where(x < *min, *min, x);
  if (max)
    x = where(x > *max, *max, x);
  return x;
}

Value softplus(Value x, Value beta, Value threshold) {
  Value scaled = x * beta;
  Value linear = scaled > threshold;
  Value safe = where(linear, ownerOf(x).scalar(0, x), scaled);
  return where(linear, x, log1p(exp(safe)) / beta);
}

Value softmax(Value x) {
  Value e = exp(x - ownerOf(x).max(x));
  return e / ownerOf(x).sum(e);
}

Value logSoftmax(Value x) {
  Value shifted = x - ownerOf(x).max(x);
  return shifted - log(ownerOf(x).sum(exp(shifted)));
}

Value logsumexp(Value x) {
  FusionBuilder &b = ownerOf(x);
  Value max = b.max(x);
  Value infinite = abs(max) == b.scalar(INFINITY, max);
  Value shift = where(infinite, b.scalar(0, max), max);
  return log(b.sum(exp(x - shift))) + shift;
}
} // namespace tilefuse::dsl
