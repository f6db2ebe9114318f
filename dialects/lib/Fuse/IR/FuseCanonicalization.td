//===- FuseCanonicalization.td - declarative fuse rewrites -*- tablegen -*-===//

#ifndef TILEFUSE_DIALECT_FUSE_IR_FUSECANONICALIZATION_TD
#define TILEFUSE_DIALECT_FUSE_IR_FUSECANONICALIZATION_TD

include "mlir/IR/PatternBase.td"
include "tilefuse/Dialect/Fuse/IR/FuseOps.td"

// cast(cast(x : A -> B) -> C) -> cast(x : A -> C) when A -> B loses nothing
// (bf16 -> f32 -> f16 is bf16 -> f16); a lossy middle step is kept, since
// f32 -> bf16 -> f32 rounds.
def LosslessCastChain : Pat<
  (Fuse_CastOp (Fuse_CastOp:$inner $x)),
  (Fuse_CastOp $x),
  [(Constraint<CPred<"isLosslessCastChain($0, $1)">> $x, $inner)]>;

// -(-x) -> x, exact for floats too.
def DoubleNegation : Pat<(Fuse_NegOp (Fuse_NegOp $x)), (replaceWithValue $x)>;

#endif // TILEFUSE_DIALECT_FUSE_IR_FUSECANONICALIZATION_TD
