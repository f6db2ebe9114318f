// RUN: tilefuse-opt %s -split-input-file -fuse-differentiate="outputs=y inputs=x" -verify-diagnostics

// expected-error @+1 {{fuse-differentiate: kernel @no_such_output has no output 'y'}}
fuse.kernel @no_such_output(%x: !fuse.full<f32>) -> (z: !fuse.full<f32>) {
  fuse.yield %x : !fuse.full<f32>
}

// -----

// expected-error @+1 {{fuse-differentiate: output 'y' is '!fuse.row<i64>', not a float value: it has no gradient}}
fuse.kernel @integer_output(%x: !fuse.full<f32>) -> (y: !fuse.row<i64>) {
  %i = fuse.arg_reduce max %x : !fuse.full<f32> to !fuse.row<i64>
  fuse.yield %i : !fuse.row<i64>
}

// -----

// expected-error @+1 {{fuse-differentiate: input 'x' is '!fuse.scalar<f32>'; only full, per-row and per-column float inputs have gradients}}
fuse.kernel @scalar_input(%x: !fuse.scalar<f32>, %z: !fuse.full<f32>) -> (y: !fuse.full<f32>) {
  %b = fuse.broadcast %x : !fuse.scalar<f32> to !fuse.full<f32>
  %y = fuse.mul %z, %b : !fuse.full<f32>
  fuse.yield %y : !fuse.full<f32>
}

// -----

fuse.kernel @column_mean(%x: !fuse.full<f32>) -> (y: !fuse.col<f32>) {
  // expected-error @+1 {{fuse-differentiate: a column mean cannot be differentiated in one kernel (only column sums can)}}
  %y = fuse.reduce mean %x : !fuse.full<f32> to !fuse.col<f32>
  fuse.yield %y : !fuse.col<f32>
}

// -----

// expected-error @+1 {{fuse-differentiate: per-column output 'y' is not a column reduction}}
fuse.kernel @column_output(%x: !fuse.full<f32>, %w: !fuse.col<f32>) -> (y: !fuse.col<f32>) {
  fuse.yield %w : !fuse.col<f32>
}
