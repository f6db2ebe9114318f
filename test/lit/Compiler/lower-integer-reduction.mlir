// RUN: tilefuse-opt %s -verify-diagnostics --pass-pipeline='builtin.module(fuse.kernel(fuse-specialize{dtype=f32 n=4096}, fuse-select-tiles{target=sm_90 threads-per-row=128}), fuse-lower-to-gpu)'

// Workgroup memory holds f32, which is exact for integers only up to 2^24.
fuse.kernel @integer_reduction(%x: !fuse.full<i32>) -> (y: !fuse.row<i32>) {
  // expected-error @+1 {{integer row reductions across warps are not supported (threads-per-row > 32); cast to f32}}
  %y = fuse.reduce sum %x : !fuse.full<i32> to !fuse.row<i32>
  fuse.yield %y : !fuse.row<i32>
}
