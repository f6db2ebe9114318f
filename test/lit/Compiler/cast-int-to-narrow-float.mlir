// An integer converted to bf16 or f16 as PyTorch converts it: to f32 first,
// then rounded again. arith's canonicalization would fold the pair into one
// conversion (one rounding: a different bf16 above 2^24, and on the CPU a
// call to __truncsfbf2, which the JIT does not have); the pipeline's
// canonicalizations leave it.
// RUN: tilefuse-compile %s --dtype=f32 --n=64 --target=sm_90 --emit=loops | FileCheck %s
// RUN: tilefuse-compile %s --dtype=f32 --n=64 --target=sm_90 -o %t.ptx
// RUN: %ptxas-check sm_90 %t.ptx
// RUN: tilefuse-compile %s --dtype=f32 --n=64 --target=cpu --emit=llvm | FileCheck %s --check-prefix=CPU

// CHECK: %[[WIDE:.+]] = arith.sitofp %{{.+}} : vector<4xi32> to vector<4xf32>
// CHECK: arith.truncf %[[WIDE]] : vector<4xf32> to vector<4xbf16>
// CHECK-NOT: arith.sitofp %{{.+}} to vector<4xbf16>
// CPU: sitofp <8 x i32> %{{.+}} to <8 x float>
// CPU-NOT: sitofp <8 x i32> %{{.+}} to <8 x bfloat>
// CPU-NOT: __truncsfbf2
module {
  fuse.kernel @k(%x: !fuse.full<i32>) -> (y: !fuse.full<bf16>) {
    %0 = fuse.cast %x : !fuse.full<i32> to !fuse.full<f32>
    %1 = fuse.cast %0 : !fuse.full<f32> to !fuse.full<bf16>
    fuse.yield %1 : !fuse.full<bf16>
  }
}
