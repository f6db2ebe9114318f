//===- Builder.h - the DSL: write a fusion with values and operators -*- C++ -*-===//
//
// The C++ skin of the DSL (Python binds the same API). A fusion is written
// as ordinary arithmetic on `Value`s; the builder emits `fuse` IR, inserting
// the broadcasts that mixing kinds needs and promoting integer operands of
// float arithmetic to the float type (a scalar against a tensor takes the
// tensor's type, as torch's Python numbers and 0-dim tensors do):
//
//   FusionBuilder b(context, "rms_norm_fwd");
//   Value x = b.input("x", Kind::Full), w = b.input("weight", Kind::Col);
//   Value eps = b.input("eps", Kind::Scalar);
//   Value rstd = rsqrt(b.mean(x * x) + eps);
//   b.output("y", x * rstd * w);
//   b.output("rstd", rstd);
//   FailureOr<OwningOpRef<ModuleOp>> module = b.finish();
//
// Reductions run over the last dimension (full -> per-row) unless they are
// column reductions (full -> per-column). Errors (an op on values of two
// builders, a reduction of a per-row value, ...) are reported through the
// context's diagnostics when finish() verifies the kernel.
//
//===----------------------------------------------------------------------===//

#ifndef TILEFUSE_COMPILER_BUILDER_H
#define TILEFUSE_COMPILER_BUILDER_H

#include "tilefuse/Dialect/Fuse/IR/Fuse.h"

#include "mlir/IR/Builders.h"
#include "mlir/IR/BuiltinOps.h"
#include "mlir/IR/OwningOpRef.h"

namespace tilefuse::dsl {

using Kind = fuse::ValueKind;
enum class DType { F32, F16, BF16, F64, I1, I32, I64 };

class FusionBuilder;

/// A value of the fusion being built.
class Value {
public:
  Value() = default;
  Value(FusionBuilder *builder, mlir::Value value)
      : builder(builder), value(value) {}

  mlir::Value get() const { return value; }
  FusionBuilder *owner() const { return builder; }
  Kind kind() const;
  explicit operator bool() const { return static_cast<bool>(value); }

private:
  FusionBuilder *builder = nullptr;
  mlir::Value value;
};

Value operator+(Value lhs, Value rhs);
Value operator-(Value lhs, Value rhs);
Value operator*(Value lhs, Value rhs);
Value operator/(Value lhs, Value rhs);
Value operator-(Value operand);
Value operator+(Value lhs, double rhs);
Value operator-(Value lhs, double rhs);
Value operator*(Value lhs, double rhs);
Value operator/(Value lhs, double rhs);
Value operator+(double lhs, Value rhs);
Value operator-(double lhs, Value rhs);
Value operator*(double lhs, Value rhs);
Value operator/(double lhs, Value rhs);
Value operator<(Value lhs, Value rhs);
Value operator<=(Value lhs, Value rhs);
Value operator>(Value lhs, Value rhs);
Value operator>=(Value lhs, Value rhs);
Value operator==(Value lhs, Value rhs);
Value operator!=(Value lhs, Value rhs);

Value exp(Value x);
Value log(Value x);
Value sqrt(Value x);
Value rsqrt(Value x);
Value tanh(Value x);
Value erf(Value x);
Value abs(Value x);
Value sigmoid(Value x);
Value log1p(Value x);
Value expm1(Value x);
Value sin(Value x);
Value cos(Value x);
Value floor(Value x);
/// Half to even, as torch.round.
Value round(Value x);
Value silu(Value x);
/// gelu(x) with approximate = "none" (erf) or "tanh", as torch.
Value gelu(Value x, llvm::StringRef approximate = "none");
Value pow(Value base, Value exponent);
Value pow(Value base, double exponent);
/// a * b + c, rounded once (math.fma).
Value fma(Value a, Value b, Value c);
/// `x` rounded to the dtype `input` (a full or per-column float input) is
/// stored in, and back: `x.to(input.dtype)` in PyTorch terms. The identity
/// where that dtype is the compute type.
Value roundToStorageOf(Value x, Value input);
Value maximum(Value lhs, Value rhs);
Value minimum(Value lhs, Value rhs);
/// torch.where(condition, a, b).
Value where(Value condition, Value a, Value b);
Value cast(Value x, DType dtype);

// Compositions with PyTorch's values at zeros, infinities and NaN (and
// gradients that the derived backward gets right).
/// -1, 0 or 1 (0 for NaN), as torch.sign.
Value sign(Value x);
/// max(x, 0), keeping -0.0 and NaN; gradient 0 at 0, as torch.relu.
Value relu(Value x);
Value square(Value x);
/// torch.clamp: either bound may be absent; min > max gives max.
Value clamp(Value x, std::optional<Value> min, std::optional<Value> max);
/// torch.nn.functional.softplus: log1p(exp(beta * x)) / beta, or x where
/// beta * x > threshold (the other branch never overflows, so its
/// gradient is never NaN).
Value softplus(Value x, Value beta, Value threshold);
// Over each row (the last dim).
Value softmax(Value x);
Value logSoftmax(Value x);
/// log(sum(exp(x))), shifted by the row max (by 0 when that is infinite,
/// as torch.logsumexp).
Value logsumexp(Value x);

class FusionBuilder {
public:
  /// `compute` is the float type inputs, constants and n default to (f32,
  /// or f64 for a float64 fusion).
  FusionBuilder(mlir::MLIRContext &context, llvm::StringRef name,
                DType compute = DType::F32);

  DType computeType() const { return compute; }

  /// Adds an input; its position is its order of declaration.
  Value input(llvm::StringRef name, Kind kind,
              std::optional<DType> dtype = std::nullopt);
  /// Declares an output (in order of declaration).
  void output(llvm::StringRef name, Value value);

  Value constant(double value, std::optional<DType> dtype = std::nullopt);
  /// n, the row length, as a scalar.
  Value rowLength(std::optional<DType> dtype = std::nullopt);
  /// The column index, per column.
  Value iota(DType dtype = DType::I64);

  // Row reductions (full -> per-row).
  Value sum(Value x);
  Value max(Value x);
  Value min(Value x);
  Value mean(Value x);
  // Column reductions (full -> per-column).
  Value columnSum(Value x);
  Value columnMax(Value x);
  Value columnMin(Value x);
  Value columnMean(Value x);
  /// The column of each row's maximum / minimum (the first among ties; a
  /// NaN counts as the extreme), as torch.argmax / argmin over the last dim.
  Value argmax(Value x);
  Value argmin(Value x);

  /// x[row, index[row]] for each row.
  Value gather(Value source, Value index);

  /// Verifies and returns the module holding the kernel; the builder is
  /// spent afterwards.
  mlir::FailureOr<mlir::OwningOpRef<mlir::ModuleOp>> finish();

  // Used by the free functions above.
  mlir::Type elementType(DType dtype);
  Value binary(llvm::StringRef op, Value lhs, Value rhs);
  Value unary(llvm::StringRef op, Value x);
  Value compare(fuse::CmpPredicate predicate, Value lhs, Value rhs);
  Value select(Value condition, Value a, Value b);
  Value fma(Value a, Value b, Value c);
  Value roundToStorageOf(Value x, Value input);
  Value castTo(Value x, mlir::Type elementType);
  Value broadcastTo(Value x, Kind kind);
  Value scalar(double value, Value like);
  Value reduce(fuse::ReduceKind kind, Value x, Kind resultKind);
  Value argReduce(fuse::ReduceKind kind, Value x);

private:
  mlir::MLIRContext &context;
  DType compute;
  mlir::OpBuilder builder;
  mlir::OwningOpRef<mlir::ModuleOp> module;
  std::string name;
  llvm::SmallVector<std::string> inputNames, outputNames;
  llvm::SmallVector<mlir::Type> inputTypes;
  llvm::SmallVector<mlir::Value> outputs;
  mlir::Block *body;
};

} // namespace tilefuse::dsl

#endif // TILEFUSE_COMPILER_BUILDER_H
