//===- FuseTypes.td - fuse value types ---------------------*- tablegen -*-===//

#ifndef TILEFUSE_DIALECT_FUSE_IR_FUSETYPES_TD
#define TILEFUSE_DIALECT_FUSE_IR_FUSETYPES_TD

include "tilefuse/Dialect/Fuse/IR/FuseBase.td"

def Fuse_ValueType : TypeDef<Fuse_Dialect, "Value"> {
  let summary = "a value of the row program: its kind and element type";
  let description = [{
    Written `!fuse.<kind><<element type>>`:

    | type                | shape       | examples                          |
    |---------------------|-------------|-----------------------------------|
    | `!fuse.full<f32>`   | `[rows, n]` | x, dy, logits                     |
    | `!fuse.row<f32>`    | `[rows]`    | mean, rstd, target index, loss    |
    | `!fuse.col<f32>`    | `[n]`       | LayerNorm weight and bias         |
    | `!fuse.scalar<f32>` | `[]`        | eps, lr, betas (runtime arguments)|

    Element types: f16, bf16, f32, f64 (gradient checks on the CPU target),
    i1 (masks), i32 and i64 (indices).
  }];
  // Parsed and printed by the dialect: the kind is the mnemonic.
  let typeName = "fuse.value";
  let parameters = (ins "::tilefuse::fuse::ValueKind":$kind, "::mlir::Type":$elementType);
  let genVerifyDecl = 1;
  let extraClassDeclaration = [{
    /// The same kind with another element type.
    ValueType withElementType(::mlir::Type elementType) const {
      return get(getContext(), getKind(), elementType);
    }
    /// The same element type with another kind.
    ValueType withKind(ValueKind kind) const {
      return get(getContext(), kind, getElementType());
    }
    bool isFloat() const { return ::llvm::isa<::mlir::FloatType>(getElementType()); }
    bool isInteger() const { return getElementType().isSignlessInteger(); }
  }];
}

#endif // TILEFUSE_DIALECT_FUSE_IR_FUSETYPES_TD
