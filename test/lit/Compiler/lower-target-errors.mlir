// RUN: not tilefuse-opt %s --pass-pipeline='builtin.module(fuse.kernel(fuse-specialize{dtype=f32 n=64}, fuse-select-tiles{target=cpu}), fuse-lower-to-gpu)' 2>&1 | FileCheck %s --check-prefix=CPU
// RUN: not tilefuse-opt %s --pass-pipeline='builtin.module(fuse.kernel(fuse-specialize{dtype=f32 n=64}), fuse-lower-to-cpu)' 2>&1 | FileCheck %s --check-prefix=UNTILED
// RUN: not tilefuse-opt %s --pass-pipeline='builtin.module(fuse.kernel(fuse-select-tiles{target=cpu}))' 2>&1 | FileCheck %s --check-prefix=UNSPECIALIZED

// CPU: error: kernel @k is tiled for cpu, not a GPU
// UNTILED: error: kernel @k has no tile configuration: run fuse-select-tiles first
// UNSPECIALIZED: error: kernel @k is not specialized: run fuse-specialize first
fuse.kernel @k(%x: !fuse.full<f32>) -> (y: !fuse.full<f32>) {
  fuse.yield %x : !fuse.full<f32>
}
