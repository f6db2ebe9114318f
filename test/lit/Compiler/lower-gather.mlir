// RUN: tilefuse-opt %s --pass-pipeline='builtin.module(fuse.kernel(fuse-specialize{dtype=f32 n=4096}, fuse-select-tiles{target=sm_90}), fuse-lower-to-gpu, canonicalize, cse)' | FileCheck %s
// RUN: tilefuse-opt %s --pass-pipeline='builtin.module(fuse.kernel(fuse-specialize{dtype=f32 n=64}, fuse-select-tiles{target=cpu}), fuse-lower-to-cpu, canonicalize, cse)' | FileCheck %s --check-prefix=CPU

// A gathered element that only per-row outputs use is loaded by the row's
// leader alone (the thread that stores them), where its row is in the
// launch: a predicated PTX load, where every thread of the row asked for the
// same element before.
// CHECK-LABEL: gpu.func @picked_only_per_row
// CHECK: %[[LEADER:.+]] = arith.cmpi eq, %{{.+}}, %c0 : index
// CHECK: %[[LOADS:.+]] = arith.andi %[[LEADER]], %{{.+}} : i1
// CHECK: llvm.inline_asm has_side_effects asm_dialect = att "@$1 ld.global.b32 $0, [$2+0];", "=f,b,l,0" %[[LOADS]],
// CHECK-NOT: llvm.load %{{.+}} : !llvm.ptr<1> -> f32
// CHECK: gpu.return
fuse.kernel @picked_only_per_row(%x: !fuse.full<f32>, %t: !fuse.row<i64>) -> (y: !fuse.row<f32>) {
  %picked = fuse.gather %x[%t] : !fuse.full<f32>, !fuse.row<i64> -> !fuse.row<f32>
  fuse.yield %picked : !fuse.row<f32>
}

// Broadcast back over the row, every thread needs it: every thread loads.
// CHECK-LABEL: gpu.func @picked_per_element
// CHECK: llvm.load %{{.+}} {alignment = 4 : i64} : !llvm.ptr<1> -> f32
// CHECK-NOT: ld.global.b32
// CHECK: gpu.return
fuse.kernel @picked_per_element(%x: !fuse.full<f32>, %t: !fuse.row<i64>) -> (y: !fuse.full<f32>) {
  %picked = fuse.gather %x[%t] : !fuse.full<f32>, !fuse.row<i64> -> !fuse.row<f32>
  %wide = fuse.broadcast %picked : !fuse.row<f32> to !fuse.full<f32>
  %y = fuse.sub %x, %wide : !fuse.full<f32>
  fuse.yield %y : !fuse.full<f32>
}

// The CPU has one thread per row: plain loads.
// CPU-LABEL: func.func @picked_only_per_row
// CPU: llvm.load %{{.+}} {alignment = 4 : i64} : !llvm.ptr -> f32
// CPU-NOT: llvm.inline_asm
