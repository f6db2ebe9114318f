// bf16 <-> f16 has no direct conversion: it goes exactly through f32, then
// rounds once (what a folded bf16 -> f32 -> f16 chain means).
// RUN: tilefuse-compile %s --dtype=bf16 --n=64 --target=sm_90 --emit=loops | FileCheck %s
// RUN: tilefuse-compile %s --dtype=bf16 --n=64 --target=sm_90 -o %t.ptx
// RUN: %ptxas-check sm_90 %t.ptx
// RUN: tilefuse-compile %s --dtype=bf16 --n=64 --target=cpu --emit=llvm | FileCheck %s --check-prefix=CPU
// f64 storage: f64 -> bf16 rounds to f32 first, as PyTorch does; x86 has
// no instruction for it and the CPU JIT no __truncdfbf2 (found by fuzzing).
// RUN: tilefuse-compile %s --dtype=f64 --n=64 --target=cpu --emit=llvm | FileCheck %s --check-prefix=F64

// CHECK: %[[X:.+]] = llvm.load %{{.+}} : !llvm.ptr<1> -> vector<8xbf16>
// CHECK: %[[WIDE:.+]] = arith.extf %[[X]] : vector<8xbf16> to vector<8xf32>
// CHECK: %[[HALF:.+]] = arith.truncf %[[WIDE]] : vector<8xf32> to vector<8xf16>
// On the CPU bf16 converts with integer operations (arith-expand): x86
// without AVX512-BF16 has no instruction, and libgcc 12 no __truncsfbf2.
// CPU: bitcast <8 x bfloat> %{{.+}} to <8 x i16>
// CPU: shl <8 x i32> %{{.+}}, splat (i32 16)
// CPU: fptrunc <8 x float> %{{.+}} to <8 x half>
// F64: %[[NARROW:.+]] = fptrunc <8 x double> %{{.+}} to <8 x float>
// F64: bitcast <8 x float> %[[NARROW]] to <8 x i32>
// F64: trunc <8 x i32> %{{.+}} to <8 x i16>
// F64-NOT: fptrunc <8 x double> %{{.+}} to <8 x {{bfloat|half}}>
module {
  fuse.kernel @k(%x: !fuse.full<bf16>) -> (y: !fuse.full<f16>) {
    %0 = fuse.cast %x : !fuse.full<bf16> to !fuse.full<f16>
    fuse.yield %0 : !fuse.full<f16>
  }
}
