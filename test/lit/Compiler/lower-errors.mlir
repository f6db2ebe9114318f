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

fuse.kernel @integer_division(%x: !fuse.full<i32>, %y: !fuse.full<i32>) -> (z: !fuse.full<i32>) {
  // expected-error @+1 {{integer division is not lowered (a zero divisor would kill the process on a CPU); divide floats}}
  %z = fuse.div %x, %y : !fuse.full<i32>
  fuse.yield %z : !fuse.full<i32>
}

// -----

// A column reduction read by the rows it reduces (it crashed the emitter).
fuse.kernel @col_reduction_read(%x: !fuse.full<f32>) -> (y: !fuse.full<f32>) {
  // expected-error @+1 {{a column reduction (over the rows) can only be an output: it is complete after every row}}
  %s = fuse.reduce sum %x : !fuse.full<f32> to !fuse.col<f32>
  %b = fuse.broadcast %s : !fuse.col<f32> to !fuse.full<f32>
  %y = fuse.sub %x, %b : !fuse.full<f32>
  fuse.yield %y : !fuse.full<f32>
}

// -----

// ... also through a cast, and beside its use as an output.
fuse.kernel @col_reduction_cast_read(%x: !fuse.full<f32>) -> (m: !fuse.col<f32>, y: !fuse.full<f32>) {
  // expected-error @+1 {{a column reduction (over the rows) can only be an output}}
  %m = fuse.reduce max %x : !fuse.full<f32> to !fuse.col<f32>
  %c = fuse.cast %m : !fuse.col<f32> to !fuse.col<f16>
  %b = fuse.broadcast %c : !fuse.col<f16> to !fuse.full<f16>
  %y = fuse.cast %b : !fuse.full<f16> to !fuse.full<f32>
  fuse.yield %m, %y : !fuse.col<f32>, !fuse.full<f32>
}

// -----

fuse.kernel @gather_computed(%x: !fuse.full<f32>, %t: !fuse.row<i64>) -> (y: !fuse.row<f32>) {
  %e = fuse.exp %x : !fuse.full<f32>
  // expected-error @+1 {{can only gather from a kernel input (possibly cast)}}
  %y = fuse.gather %e[%t] : !fuse.full<f32>, !fuse.row<i64> -> !fuse.row<f32>
  fuse.yield %y : !fuse.row<f32>
}
