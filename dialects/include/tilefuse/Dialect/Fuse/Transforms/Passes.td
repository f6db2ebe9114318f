//===- Passes.td - fuse-to-fuse passes ---------------------*- tablegen -*-===//

#ifndef TILEFUSE_DIALECT_FUSE_TRANSFORMS_PASSES_TD
#define TILEFUSE_DIALECT_FUSE_TRANSFORMS_PASSES_TD

include "mlir/Pass/PassBase.td"

def FuseHoistBroadcasts : Pass<"fuse-hoist-broadcasts", "::tilefuse::fuse::KernelOp"> {
  let summary = "Compute elementwise ops at the narrowest kind, then broadcast";
  let description = [{
    An elementwise op whose operands are all broadcasts (or constants) is
    rewritten to run on the broadcast sources, at the narrowest kind they
    join to, and broadcast once afterwards:

    ```mlir
    %a = fuse.broadcast %r : !fuse.row<f32> to !fuse.full<f32>
    %b = fuse.broadcast %s : !fuse.scalar<f32> to !fuse.full<f32>
    %c = fuse.mul %a, %b : !fuse.full<f32>
    // becomes
    %0 = fuse.broadcast %s : !fuse.scalar<f32> to !fuse.row<f32>
    %1 = fuse.mul %r, %0 : !fuse.row<f32>
    %c = fuse.broadcast %1 : !fuse.row<f32> to !fuse.full<f32>
    ```
    A per-row product is computed `rows` times instead of `rows * n` times;
    scalar-only arithmetic (Adam's bias corrections) once per launch.
  }];
  let dependentDialects = ["::tilefuse::fuse::FuseDialect"];
}

#endif // TILEFUSE_DIALECT_FUSE_TRANSFORMS_PASSES_TD
