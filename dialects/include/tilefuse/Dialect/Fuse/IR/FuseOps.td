//===- FuseOps.td - fuse dialect operations ----------------*- tablegen -*-===//

#ifndef TILEFUSE_DIALECT_FUSE_IR_FUSEOPS_TD
#define TILEFUSE_DIALECT_FUSE_IR_FUSEOPS_TD

include "tilefuse/Dialect/Fuse/IR/FuseBase.td"
include "tilefuse/Dialect/Fuse/IR/FuseTypes.td"
include "mlir/IR/BuiltinAttributes.td"
include "mlir/IR/OpAsmInterface.td"
include "mlir/IR/SymbolInterfaces.td"
include "mlir/Interfaces/ControlFlowInterfaces.td"
include "mlir/Interfaces/SideEffectInterfaces.td"

def Fuse_Value : Type<CPred<"::llvm::isa<::tilefuse::fuse::ValueType>($_self)">,
                      "fuse value", "::tilefuse::fuse::ValueType">;

//===----------------------------------------------------------------------===//
// The kernel
//===----------------------------------------------------------------------===//

def Fuse_KernelOp : Fuse_Op<"kernel", [
    IsolatedFromAbove, Symbol, SingleBlock,
    DeclareOpInterfaceMethods<OpAsmOpInterface, ["getAsmBlockArgumentNames"]>]> {
  let summary = "one fused kernel: named inputs, a row program, named outputs";
  let description = [{
    ```mlir
    fuse.kernel @rms_norm_fwd(%x: !fuse.full<f32>, %weight: !fuse.col<f32>,
                              %eps: !fuse.scalar<f32>)
        -> (y: !fuse.full<f32>, rstd: !fuse.row<f32>) {
      ...
      fuse.yield %y, %rstd : !fuse.full<f32>, !fuse.row<f32>
    }
    ```
    Inputs are the block arguments; their names (`input_names`) and the
    output names (`output_names`) are part of the kernel's interface: the
    runtime binds tensors by them. Attributes after `attributes` carry
    specialization and tiling decisions.
  }];
  let arguments = (ins SymbolNameAttr:$sym_name,
                       TypeAttrOf<FunctionType>:$function_type,
                       StrArrayAttr:$input_names,
                       StrArrayAttr:$output_names);
  let regions = (region SizedRegion<1>:$body);
  let hasCustomAssemblyFormat = 1;
  let hasVerifier = 1;
  let hasRegionVerifier = 1;
  let skipDefaultBuilders = 1;
  let builders = [
    // Creates the kernel with an entry block whose arguments are the inputs.
    OpBuilder<(ins "::llvm::StringRef":$name,
                   "::llvm::ArrayRef<::llvm::StringRef>":$inputNames,
                   "::mlir::TypeRange":$inputTypes,
                   "::llvm::ArrayRef<::llvm::StringRef>":$outputNames,
                   "::mlir::TypeRange":$outputTypes)>
  ];
  let extraClassDeclaration = [{
    ::mlir::Block &getEntryBlock() { return getBody().front(); }
    ::llvm::ArrayRef<::mlir::Type> getInputTypes() { return getFunctionType().getInputs(); }
    ::llvm::ArrayRef<::mlir::Type> getOutputTypes() { return getFunctionType().getResults(); }
    /// The input bound to `name`, or null.
    ::mlir::BlockArgument getInput(::llvm::StringRef name);
  }];
}

def Fuse_YieldOp : Fuse_Op<"yield", [Pure, Terminator, ReturnLike, HasParent<"KernelOp">]> {
  let summary = "the kernel's outputs, in declaration order";
  let arguments = (ins Variadic<Fuse_Value>:$values);
  let assemblyFormat = "($values^ `:` type($values))? attr-dict";
  let hasVerifier = 1;
}

//===----------------------------------------------------------------------===//
// Elementwise arithmetic and math
//===----------------------------------------------------------------------===//

// Every operand and the result have one kind and one element type; mixing
// kinds takes a fuse.broadcast, mixing element types a fuse.cast. Written
// `fuse.add %a, %b : !fuse.full<f32>`. They lower to the arith/math op named
// in the description, applied per element.
class Fuse_ElementwiseOp<string mnemonic, bit floatOnly, list<Trait> traits = []>
    : Fuse_Op<mnemonic, !listconcat(traits, [Pure, Elementwise])> {
  let results = (outs Fuse_Value:$result);
  let hasCustomAssemblyFormat = 1;
  let hasVerifier = 1;
  let extraClassDefinition = [{
    ::mlir::ParseResult $cppClass::parse(::mlir::OpAsmParser &parser,
                                         ::mlir::OperationState &result) {
      return parseElementwiseOp(parser, result);
    }
    void $cppClass::print(::mlir::OpAsmPrinter &printer) {
      printElementwiseOp(printer, getOperation());
    }
    ::llvm::LogicalResult $cppClass::verify() {
      return verifyElementwiseOp(getOperation(), }] # !if(floatOnly, "true", "false") # [{);
    }
  }];
}

class Fuse_UnaryOp<string mnemonic, bit floatOnly, string lowersTo, list<Trait> traits = []>
    : Fuse_ElementwiseOp<mnemonic, floatOnly, traits> {
  let summary = "elementwise " # mnemonic;
  let description = "Lowers to `" # lowersTo # "` per element.";
  let arguments = (ins Fuse_Value:$operand);
}

class Fuse_BinaryOp<string mnemonic, bit floatOnly, string lowersTo, list<Trait> traits = []>
    : Fuse_ElementwiseOp<mnemonic, floatOnly, traits> {
  let summary = "elementwise " # mnemonic;
  let description = "Lowers to `" # lowersTo # "` per element.";
  let arguments = (ins Fuse_Value:$lhs, Fuse_Value:$rhs);
}

def Fuse_NegOp : Fuse_UnaryOp<"neg", 0, "arith.negf / 0 - x"> {
  let hasCanonicalizer = 1;
}
def Fuse_AbsOp : Fuse_UnaryOp<"abs", 0, "math.absf / math.absi">;
def Fuse_ExpOp : Fuse_UnaryOp<"exp", 1, "math.exp">;
def Fuse_LogOp : Fuse_UnaryOp<"log", 1, "math.log">;
def Fuse_SqrtOp : Fuse_UnaryOp<"sqrt", 1, "math.sqrt">;
def Fuse_RsqrtOp : Fuse_UnaryOp<"rsqrt", 1, "math.rsqrt">;
def Fuse_TanhOp : Fuse_UnaryOp<"tanh", 1, "math.tanh">;
def Fuse_ErfOp : Fuse_UnaryOp<"erf", 1, "math.erf">;
def Fuse_SigmoidOp : Fuse_UnaryOp<"sigmoid", 1, "1 / (1 + math.exp(-x))">;
// Primitives rather than compositions: log(1 + x) and exp(x) - 1 lose every
// digit for small x; sin and cos need their own range reduction.
def Fuse_Log1pOp : Fuse_UnaryOp<"log1p", 1, "math.log1p">;
def Fuse_Expm1Op : Fuse_UnaryOp<"expm1", 1, "math.expm1">;
def Fuse_SinOp : Fuse_UnaryOp<"sin", 1, "math.sin">;
def Fuse_CosOp : Fuse_UnaryOp<"cos", 1, "math.cos">;
def Fuse_FloorOp : Fuse_UnaryOp<"floor", 1, "math.floor"> {
  let hasFolder = 1;
}
// Half to even, as torch.round.
def Fuse_RoundOp : Fuse_UnaryOp<"round", 1, "math.roundeven"> {
  let hasFolder = 1;
}

def Fuse_AddOp : Fuse_BinaryOp<"add", 0, "arith.addf / arith.addi", [Commutative]> {
  let hasFolder = 1;
}
def Fuse_SubOp : Fuse_BinaryOp<"sub", 0, "arith.subf / arith.subi"> {
  let hasFolder = 1;
}
def Fuse_MulOp : Fuse_BinaryOp<"mul", 0, "arith.mulf / arith.muli", [Commutative]> {
  let hasFolder = 1;
}
def Fuse_DivOp : Fuse_BinaryOp<"div", 0, "arith.divf / arith.divsi"> {
  let hasFolder = 1;
}
// NaN-propagating like torch.maximum / torch.minimum.
def Fuse_MaximumOp : Fuse_BinaryOp<"maximum", 0, "arith.maximumf / arith.maxsi", [Commutative]>;
def Fuse_MinimumOp : Fuse_BinaryOp<"minimum", 0, "arith.minimumf / arith.minsi", [Commutative]>;
def Fuse_PowOp : Fuse_BinaryOp<"pow", 1, "math.powf">;

def Fuse_FmaOp : Fuse_ElementwiseOp<"fma", 1> {
  let summary = "fused multiply-add: a * b + c, rounded once";
  let description = [{
    `%r = fuse.fma %a, %b, %c : !fuse.full<f32>` lowers to `math.fma`. It is
    how a fusion reproduces the single rounding of an FMA in the code it must
    match bit for bit (PyTorch's lerp and addcmul kernels use one).
  }];
  let arguments = (ins Fuse_Value:$a, Fuse_Value:$b, Fuse_Value:$c);
}

def Fuse_CmpOp : Fuse_Op<"cmp", [Pure, Elementwise]> {
  let summary = "elementwise comparison, yielding an i1 mask of the same kind";
  let description = [{
    `%m = fuse.cmp lt, %a, %b : !fuse.full<f32>` compares two values of one
    type; the result has the same kind and element type i1. Float
    comparisons follow PyTorch: with a NaN operand only `ne` is true.
  }];
  let arguments = (ins Fuse_CmpPredicate:$predicate, Fuse_Value:$lhs, Fuse_Value:$rhs);
  let results = (outs Fuse_Value:$result);
  let hasCustomAssemblyFormat = 1;
  let hasVerifier = 1;
}

def Fuse_SelectOp : Fuse_Op<"select", [Pure, Elementwise]> {
  let summary = "elementwise choice by an i1 mask (torch.where)";
  let description = [{
    `%r = fuse.select %mask, %a, %b : !fuse.full<f32>`: the mask has the
    same kind as `%a` and `%b` and element type i1.
  }];
  let arguments = (ins Fuse_Value:$condition, Fuse_Value:$true_value, Fuse_Value:$false_value);
  let results = (outs Fuse_Value:$result);
  let hasCustomAssemblyFormat = 1;
  let hasVerifier = 1;
  let hasFolder = 1;
}

//===----------------------------------------------------------------------===//
// Constants, casts, broadcasts
//===----------------------------------------------------------------------===//

def Fuse_ConstantOp : Fuse_Op<"constant", [ConstantLike, Pure]> {
  let summary = "a constant, splat over its kind";
  let description = [{
    `%c = fuse.constant 1.0 : !fuse.scalar<f32>`. Constants of any kind are
    splats; canonicalization folds a broadcast of a constant into one.
  }];
  let arguments = (ins TypedAttrInterface:$value);
  let results = (outs Fuse_Value:$result);
  let hasCustomAssemblyFormat = 1;
  let hasVerifier = 1;
  let hasFolder = 1;
  let builders = [
    OpBuilder<(ins "::tilefuse::fuse::ValueType":$type, "double":$value)>
  ];
}

def Fuse_CastOp : Fuse_Op<"cast", [Pure]> {
  let summary = "element type conversion (float<->float, int<->float, i1->number)";
  let description = [{
    Changes the element type, never the kind. Float narrowing rounds to
    nearest even; float to integer truncates toward zero.
  }];
  let arguments = (ins Fuse_Value:$input);
  let results = (outs Fuse_Value:$result);
  let assemblyFormat = "$input attr-dict `:` type($input) `to` type($result)";
  let hasVerifier = 1;
  let hasFolder = 1;
  let hasCanonicalizer = 1;
}

def Fuse_RoundToStorageOp : Fuse_Op<"round_to_storage", [
    Pure, AllTypesMatch<["value", "result"]>]> {
  let summary = "rounds a value to the storage dtype of a kernel input";
  let description = [{
    `%r = fuse.round_to_storage %v of %x : !fuse.full<f32>, !fuse.full<f32>`
    is `%v` rounded to the dtype `%x` (a full or per-column float input of
    the kernel) is stored in, and back: what `t.to(x.dtype)` or an op on
    stored tensors does to an intermediate value in the PyTorch code a
    fusion reproduces (`hidden.to(input_dtype)` in Llama's RMSNorm, the
    rounding of each in-place step of `torch.optim.AdamW` on bf16 state).
    `fuse-specialize` replaces it by the two casts, or by `%v` itself when
    the storage dtype is the compute type.
  }];
  let arguments = (ins Fuse_Value:$value, Fuse_Value:$input);
  let results = (outs Fuse_Value:$result);
  let assemblyFormat =
      "$value `of` $input attr-dict `:` type($value) `,` type($input)";
  let hasVerifier = 1;
}

def Fuse_BroadcastOp : Fuse_Op<"broadcast", [Pure]> {
  let summary = "widens a value's kind (scalar -> any, row/col -> full)";
  let arguments = (ins Fuse_Value:$input);
  let results = (outs Fuse_Value:$result);
  let assemblyFormat = "$input attr-dict `:` type($input) `to` type($result)";
  let hasVerifier = 1;
  let hasFolder = 1;
}

//===----------------------------------------------------------------------===//
// Reductions and indexing
//===----------------------------------------------------------------------===//

def Fuse_ReduceOp : Fuse_Op<"reduce", [Pure]> {
  let summary = "row or column reduction of a full value";
  let description = [{
    The result kind picks the axis: `-> !fuse.row<...>` reduces each row over
    its `n` columns (mean, max of logits); `-> !fuse.col<...>` reduces each
    column over all rows (dweight, dbias: per-block partials plus a final
    reduction, deterministic run to run).

    ```mlir
    %ms = fuse.reduce mean %x2 : !fuse.full<f32> to !fuse.row<f32>
    %dw = fuse.reduce sum %g : !fuse.full<f32> to !fuse.col<f32>
    ```
    `max` and `min` propagate NaN like `torch.amax`.
  }];
  let arguments = (ins Fuse_ReduceKind:$kind, Fuse_Value:$input);
  let results = (outs Fuse_Value:$result);
  let assemblyFormat = "$kind $input attr-dict `:` type($input) `to` type($result)";
  let hasVerifier = 1;
  let hasFolder = 1;
  let hasCanonicalizer = 1;
  let extraClassDeclaration = [{
    /// Whether this reduces along rows (full -> row) rather than columns.
    bool isRowReduction() { return getResult().getType().getKind() == ValueKind::Row; }
  }];
}

def Fuse_ArgReduceOp : Fuse_Op<"arg_reduce", [Pure]> {
  let summary = "the column of each row's maximum or minimum (argmax, argmin)";
  let description = [{
    ```mlir
    %i = fuse.arg_reduce max %x : !fuse.full<f32> to !fuse.row<i64>
    ```
    Like `torch.argmax` / `torch.argmin` over the last dim: the first
    column among ties, and a NaN counts as the extreme (the first NaN's
    column). The kind is `max` or `min`; the input is a float or a signed
    integer (not i1), the result a per-row i32 or i64.
  }];
  let arguments = (ins Fuse_ReduceKind:$kind, Fuse_Value:$input);
  let results = (outs Fuse_Value:$result);
  let assemblyFormat = "$kind $input attr-dict `:` type($input) `to` type($result)";
  let hasVerifier = 1;
  let hasFolder = 1;
}

// Merged row reductions: two dependent reduction levels computed in one
// pass over the row. fuse-merge-reductions creates them; nothing else needs
// to (they are not part of the DSL).
class Fuse_MergedReductionOp<string mnemonic, string first, string second>
    : Fuse_Op<mnemonic, [Pure, AllTypesMatch<[first, second]>]> {
  let hasVerifier = 1;
}

def Fuse_MaxSumExpOp : Fuse_MergedReductionOp<"max_sum_exp", "max", "sum_exp"> {
  let summary = "each row's maximum and sum of exp(x - maximum), in one pass";
  let description = [{
    ```mlir
    %max, %sum_exp = fuse.max_sum_exp %x : !fuse.full<f32> to !fuse.row<f32>
    ```
    The same values as `fuse.reduce max %x` and `fuse.reduce sum` of
    `exp(x - max)` (an online softmax normalizer: the running sum is
    rescaled when the running maximum grows), including the non-finite
    cases: a row whose maximum is +inf, -inf or NaN has a NaN `sum_exp`, as
    the two passes give; -inf elements of other rows add 0.
  }];
  let arguments = (ins Fuse_Value:$input);
  let results = (outs Fuse_Value:$max, Fuse_Value:$sum_exp);
  let assemblyFormat = "$input attr-dict `:` type($input) `to` type($max)";
}

def Fuse_MaxDeviationOp : Fuse_Op<"max_deviation",
    [Pure, AllTypesMatch<["max", "deviation", "weights"]>, AllTypesMatch<["input", "weight"]>]> {
  let summary = "each row's maximum, weighted sum of x - maximum and sum of weights, in one pass";
  let description = [{
    ```mlir
    %max, %dev, %weights = fuse.max_deviation %x, %w : !fuse.full<f32> to !fuse.row<f32>
    ```
    The same values as `fuse.reduce max %x`, `fuse.reduce sum` of
    `w * (x - max)` (a loss against probability targets) and `fuse.reduce
    sum %w`, which the merged sum keeps anyway. Each thread sums
    `w * (x - m)` about its running maximum `m` and, when `m` grows by `d`,
    subtracts `d` times its sum of `w` so far: every term stays relative
    to a maximum, as in two passes (summing `w * x` and subtracting `max *
    sum(w)` loses the digits of logits far from zero, and centering on
    any other element fails where that element is an outlier, a masked
    logit). A row whose maximum is +inf, -inf or NaN has a NaN
    `deviation`, as two passes give.
  }];
  let arguments = (ins Fuse_Value:$input, Fuse_Value:$weight);
  let results = (outs Fuse_Value:$max, Fuse_Value:$deviation, Fuse_Value:$weights);
  let assemblyFormat = "$input `,` $weight attr-dict `:` type($input) `to` type($max)";
  let hasVerifier = 1;
}

def Fuse_MomentsOp : Fuse_MergedReductionOp<"moments", "mean", "deviations"> {
  let summary = "each row's mean and sum or mean of squared deviations, in one pass";
  let description = [{
    ```mlir
    %mean, %var = fuse.moments mean %x : !fuse.full<f32> to !fuse.row<f32>
    ```
    `mean` of `x`, and the `kind` (`sum` or `mean`) over the row of
    `(x - mean)^2`: what `fuse.reduce mean %x` followed by a reduction of
    the squared centered values computes, with Welford updates inside a
    thread and Chan's merge between partial states (as accurate as two
    passes for rows with a large mean).
  }];
  let arguments = (ins Fuse_ReduceKind:$kind, Fuse_Value:$input);
  let results = (outs Fuse_Value:$mean, Fuse_Value:$deviations);
  let assemblyFormat = "$kind $input attr-dict `:` type($input) `to` type($mean)";
}

def Fuse_GatherOp : Fuse_Op<"gather", [Pure]> {
  let summary = "one element per row, at a per-row column index";
  let description = [{
    `%t = fuse.gather %logits[%target] : !fuse.full<f32>, !fuse.row<i64> -> !fuse.row<f32>`
    reads `logits[r, target[r]]` for each row r (cross-entropy's target logit).
    An index outside `[0, n)` is an error the runtime checks, never a read
    out of bounds.
  }];
  let arguments = (ins Fuse_Value:$source, Fuse_Value:$index);
  let results = (outs Fuse_Value:$result);
  let assemblyFormat = [{
    $source `[` $index `]` attr-dict `:` type($source) `,` type($index) `->` type($result)
  }];
  let hasVerifier = 1;
}

def Fuse_IotaOp : Fuse_Op<"iota", [Pure]> {
  let summary = "the column index 0..n-1, as a per-column integer value";
  let results = (outs Fuse_Value:$result);
  let assemblyFormat = "attr-dict `:` type($result)";
  let hasVerifier = 1;
}

def Fuse_RowLengthOp : Fuse_Op<"row_length", [Pure]> {
  let summary = "n, the number of columns, as a scalar";
  let description = [{
    A constant once the kernel is specialized on `n`; before that, the
    value a generic fusion divides by.
  }];
  let results = (outs Fuse_Value:$result);
  let assemblyFormat = "attr-dict `:` type($result)";
  let hasVerifier = 1;
}

#endif // TILEFUSE_DIALECT_FUSE_IR_FUSEOPS_TD
