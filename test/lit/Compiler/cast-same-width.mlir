// bf16 <-> f16 has no direct conversion: it goes exactly through f32, then
// rounds once (what a folded bf16 -> f32 -> f16 chain means).
// RUN: tilefuse-compile %s --dtype=bf16 --n=64 --target=sm_90 --emit=loops | FileCheck %s
// RUN: tilefuse-compile %s --dtype=bf16 --n=64 --target=sm_90 -o %t.ptx
// RUN: %ptxas-check sm_90 %t.ptx
// RUN: tilefuse-compile %s --dtype=bf16 --n=64 --target=cpu --emit=llvm | FileCheck %s --check-prefix=CPU

// CHECK: %[[X:.+]] = llvm.load %{{.+}} : !llvm.ptr<1> -> vector<8xbf16>
// CHECK: %[[WIDE:.+]] = arith.extf %[[X]] : vector<8xbf16> to vector<8xf32>
// CHECK: %[[HALF:.+]] = arith.truncf %[[WIDE]] : vector<8xf32> to vector<8xf16>
// CPU: fpext <8 x bfloat> %{{.+}} to <8 x float>
// CPU: fptrunc <8 x float> %{{.+}} to <8 x half>
module {
  fuse.kernel @k(%x: !fuse.full<bf16>) -> (y: !fuse.full<f16>) {
    %0 = fuse.cast %x : !fuse.full<bf16> to !fuse.full<f16>
    fuse.yield %0 : !fuse.full<f16>
  }
}
