// RUN: tilefuse-opt %s --pass-pipeline='builtin.module(fuse.kernel(fuse-specialize{dtype=f32 n=1024}, fuse-select-tiles{target=sm_90}), fuse-lower-to-gpu, canonicalize, cse)' | FileCheck %s --check-prefix=GPU
// RUN: tilefuse-opt %s --pass-pipeline='builtin.module(fuse.kernel(fuse-specialize{dtype=f32 n=64}, fuse-select-tiles{target=cpu}), fuse-lower-to-cpu, canonicalize, cse)' | FileCheck %s --check-prefix=CPU

// Masks in memory take a byte per element, as a torch.bool: a vector of
// i1 is loaded as bytes and compared with zero, and stored widened to
// bytes (LLVM packs a vector of i1 into bits).
// GPU-LABEL: gpu.func @mask_in_and_out
// GPU: %[[BYTES:.+]] = llvm.load %{{.+}} {alignment = 4 : i64} : !llvm.ptr<1> -> vector<4xi8>
// GPU: arith.cmpi ne, %[[BYTES]], %{{.+}} : vector<4xi8>
// GPU: %[[WIDE:.+]] = arith.extui %{{.+}} : vector<4xi1> to vector<4xi8>
// GPU: llvm.store %[[WIDE]], %{{.+}} {alignment = 4 : i64} : vector<4xi8>, !llvm.ptr<1>
// GPU-NOT: vector<4xi1>, !llvm.ptr
// GPU-NOT: -> vector<4xi1>
// CPU-LABEL: func.func @mask_in_and_out
// CPU: %[[BYTES:.+]] = llvm.load %{{.+}} {alignment = 8 : i64} : !llvm.ptr -> vector<8xi8>
// CPU: arith.cmpi ne, %[[BYTES]], %{{.+}} : vector<8xi8>
// CPU: %[[WIDE:.+]] = arith.extui %{{.+}} : vector<8xi1> to vector<8xi8>
// CPU: llvm.store %[[WIDE]], %{{.+}} {alignment = 8 : i64} : vector<8xi8>, !llvm.ptr
// CPU-NOT: -> vector<8xi1>
fuse.kernel @mask_in_and_out(%m: !fuse.full<i1>, %x: !fuse.full<f32>) -> (y: !fuse.full<f32>, positive: !fuse.full<i1>) {
  %zero = fuse.constant full 0.000000e+00 : f32
  %y = fuse.select %m, %x, %zero : !fuse.full<f32>
  %p = fuse.cmp gt, %x, %zero : !fuse.full<f32>
  fuse.yield %y, %p : !fuse.full<f32>, !fuse.full<i1>
}

// Masks order false < true, as torch.bool: unsigned compares (signed, an
// i1 true is -1).
// GPU-LABEL: gpu.func @mask_order
// GPU: arith.cmpi ult, %{{.+}}, %{{.+}} : vector<4xi1>
// GPU: arith.cmpi uge, %{{.+}}, %{{.+}} : vector<4xi1>
// CPU-LABEL: func.func @mask_order
// CPU: arith.cmpi ult, %{{.+}}, %{{.+}} : vector<8xi1>
fuse.kernel @mask_order(%a: !fuse.full<i1>, %b: !fuse.full<i1>) -> (lt: !fuse.full<i1>, ge: !fuse.full<i1>) {
  %lt = fuse.cmp lt, %a, %b : !fuse.full<i1>
  %ge = fuse.cmp ge, %a, %b : !fuse.full<i1>
  fuse.yield %lt, %ge : !fuse.full<i1>, !fuse.full<i1>
}
