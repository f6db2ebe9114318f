// RUN: not tilefuse-opt %s --pass-pipeline='builtin.module(fuse.kernel(fuse-specialize{dtype=bf16 n=0}))' 2>&1 | FileCheck %s --check-prefix=ZERO
// RUN: not tilefuse-opt %s --pass-pipeline='builtin.module(fuse.kernel(fuse-specialize{dtype=fp8 n=16}))' 2>&1 | FileCheck %s --check-prefix=DTYPE
// RUN: not tilefuse-opt %s --pass-pipeline='builtin.module(fuse.kernel(fuse-specialize{dtype=bf16 n=16},fuse-specialize{dtype=bf16 n=16}))' 2>&1 | FileCheck %s --check-prefix=TWICE
// RUN: not tilefuse-opt %s --pass-pipeline='builtin.module(fuse.kernel(fuse-specialize{dtype=bf16,z=f32 n=16}))' 2>&1 | FileCheck %s --check-prefix=PORT
// RUN: not tilefuse-opt %s --pass-pipeline='builtin.module(fuse.kernel(fuse-specialize{dtype=bf16,s=f32 n=16}))' 2>&1 | FileCheck %s --check-prefix=SCALAR
// RUN: not tilefuse-opt %s --pass-pipeline='builtin.module(fuse.kernel(fuse-specialize{dtype=bf16,x=fp8 n=16}))' 2>&1 | FileCheck %s --check-prefix=PORTDTYPE
// RUN: not tilefuse-opt %s --pass-pipeline='builtin.module(fuse.kernel(fuse-specialize{dtype=bf16,x=f32,x=f16 n=16}))' 2>&1 | FileCheck %s --check-prefix=DUPLICATE

// ZERO: error: fuse-specialize: n must be positive, got 0
// DTYPE: error: fuse-specialize: unsupported dtype 'fp8': expected f32, f16, bf16, f64 or declared
// TWICE: error: fuse-specialize: kernel @k is already specialized
// PORT: error: fuse-specialize: 'z=f32': kernel @k has no full or per-column float input or output named 'z'
// SCALAR: error: fuse-specialize: 's=f32': kernel @k has no full or per-column float input or output named 's'
// PORTDTYPE: error: fuse-specialize: 'x=fp8': expected port=dtype with dtype f32, f16, bf16 or f64
// DUPLICATE: error: fuse-specialize: port 'x' is given two storage dtypes
fuse.kernel @k(%x: !fuse.full<f32>, %s: !fuse.scalar<f32>) -> (y: !fuse.full<f32>) {
  fuse.yield %x : !fuse.full<f32>
}
