// RUN: not tilefuse-opt %s --pass-pipeline='builtin.module(fuse.kernel(fuse-specialize{dtype=bf16 n=0}))' 2>&1 | FileCheck %s --check-prefix=ZERO
// RUN: not tilefuse-opt %s --pass-pipeline='builtin.module(fuse.kernel(fuse-specialize{dtype=fp8 n=16}))' 2>&1 | FileCheck %s --check-prefix=DTYPE
// RUN: not tilefuse-opt %s --pass-pipeline='builtin.module(fuse.kernel(fuse-specialize{dtype=bf16 n=16},fuse-specialize{dtype=bf16 n=16}))' 2>&1 | FileCheck %s --check-prefix=TWICE

// ZERO: error: fuse-specialize: n must be positive, got 0
// DTYPE: error: fuse-specialize: unsupported dtype 'fp8': expected f32, f16, bf16, f64 or declared
// TWICE: error: fuse-specialize: kernel @k is already specialized
fuse.kernel @k(%x: !fuse.full<f32>) -> (y: !fuse.full<f32>) {
  fuse.yield %x : !fuse.full<f32>
}
