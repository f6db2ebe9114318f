//===- FuseBase.td - the fuse dialect and its enums --------*- tablegen -*-===//
//
// A fusion is a row program over an iteration space [rows, n]. Every value has
// a kind, fixed by how it broadcasts over that space (see FuseTypes.td).
//
//===----------------------------------------------------------------------===//

#ifndef TILEFUSE_DIALECT_FUSE_IR_FUSEBASE_TD
#define TILEFUSE_DIALECT_FUSE_IR_FUSEBASE_TD

include "mlir/IR/OpBase.td"
include "mlir/IR/AttrTypeBase.td"
include "mlir/IR/EnumAttr.td"

def Fuse_Dialect : Dialect {
  let name = "fuse";
  let cppNamespace = "::tilefuse::fuse";
  let summary = "Row programs for fused elementwise/reduction kernels";
  let description = [{
    The `fuse` dialect describes one fused kernel as a program over rows of
    an `[rows, n]` iteration space. `rows` (batch x sequence) is always a
    runtime value; `n` is what kernels are specialized on. Values are
    full (`[rows, n]`), per-row (`[rows]`), per-column (`[n]`) or scalar
    (`[]`); mixing kinds takes an explicit `fuse.broadcast`.
  }];
  let useDefaultTypePrinterParser = 0;
  let hasConstantMaterializer = 1;
  let extraClassDeclaration = [{
    ::mlir::Type parseType(::mlir::DialectAsmParser &parser) const override;
    void printType(::mlir::Type type, ::mlir::DialectAsmPrinter &printer) const override;
  private:
    void registerTypes();
  }];
}

// How a value broadcasts over the [rows, n] iteration space. The order is the
// lattice used by broadcasts: scalar < row, col < full.
def Fuse_ValueKind : I32EnumAttr<"ValueKind", "kind of a fuse value", [
    I32EnumAttrCase<"Scalar", 0, "scalar">,
    I32EnumAttrCase<"Row", 1, "row">,
    I32EnumAttrCase<"Col", 2, "col">,
    I32EnumAttrCase<"Full", 3, "full">,
  ]> {
  let cppNamespace = "::tilefuse::fuse";
  let genSpecializedAttr = 0;
}

def Fuse_ReduceKind : I32EnumAttr<"ReduceKind", "reduction combiner", [
    I32EnumAttrCase<"Sum", 0, "sum">,
    I32EnumAttrCase<"Max", 1, "max">,
    I32EnumAttrCase<"Min", 2, "min">,
    I32EnumAttrCase<"Mean", 3, "mean">,
  ]> {
  let cppNamespace = "::tilefuse::fuse";
}

// Comparison predicates. Float comparisons follow PyTorch: every comparison
// with a NaN is false except `ne`, which is true.
def Fuse_CmpPredicate : I32EnumAttr<"CmpPredicate", "comparison predicate", [
    I32EnumAttrCase<"eq", 0>,
    I32EnumAttrCase<"ne", 1>,
    I32EnumAttrCase<"lt", 2>,
    I32EnumAttrCase<"le", 3>,
    I32EnumAttrCase<"gt", 4>,
    I32EnumAttrCase<"ge", 5>,
  ]> {
  let cppNamespace = "::tilefuse::fuse";
}

class Fuse_Op<string mnemonic, list<Trait> traits = []>
    : Op<Fuse_Dialect, mnemonic, traits>;

#endif // TILEFUSE_DIALECT_FUSE_IR_FUSEBASE_TD
