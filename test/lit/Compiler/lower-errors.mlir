// RUN: tilefuse-opt %s -split-input-file -verify-diagnostics --pass-pipeline='builtin.module(fuse.kernel(fuse-specialize{dtype=f32 n=64}, fuse-select-tiles{target=sm_90}), fuse-lower-to-gpu)'

// expected-error @+1 {{output #0: scalar outputs cannot be lowered; return a per-row value instead}}
fuse.kernel @scalar_output(%x: !fuse.full<f32>, %s: !fuse.scalar<f32>) -> (y: !fuse.scalar<f32>) {
  fuse.yield %s : !fuse.scalar<f32>
}

// -----

// expected-error @+1 {{output #0: a per-column output must be a column reduction}}
fuse.kernel @col_output(%x: !fuse.full<f32>, %w: !fuse.col<f32>) -> (y: !fuse.col<f32>) {
  fuse.yield %w : !fuse.col<f32>
}

// -----

fuse.kernel @gather_computed(%x: !fuse.full<f32>, %t: !fuse.row<i64>) -> (y: !fuse.row<f32>) {
  %e = fuse.exp %x : !fuse.full<f32>
  // expected-error @+1 {{can only gather from a kernel input (possibly cast)}}
  %y = fuse.gather %e[%t] : !fuse.full<f32>, !fuse.row<i64> -> !fuse.row<f32>
  fuse.yield %y : !fuse.row<f32>
}
