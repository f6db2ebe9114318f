// RUN: tilefuse-opt %s --split-input-file --pass-pipeline='builtin.module(fuse.kernel(fuse-specialize{dtype=f32 n=4096}, fuse-select-tiles{target=sm_90 threads-per-row=128}), fuse-lower-to-gpu)' | FileCheck %s

// Integer row reductions across warps: each warp's state crosses workgroup
// memory as its bits, in 32-bit slots for i32 states.
// CHECK-LABEL: gpu.func @i32_sum(
// CHECK-SAME: workgroup(%{{.+}} : memref<8xf32, #gpu.address_space<workgroup>>)
// CHECK: gpu.shuffle  xor %{{.+}} : i32
// CHECK: arith.bitcast %{{.+}} : i32 to f32
// CHECK: gpu.barrier
// CHECK: arith.bitcast %{{.+}} : f32 to i32
// CHECK: arith.addi %{{.+}} : i32
fuse.kernel @i32_sum(%x: !fuse.full<i32>) -> (y: !fuse.row<i32>) {
  %y = fuse.reduce sum %x : !fuse.full<i32> to !fuse.row<i32>
  fuse.yield %y : !fuse.row<i32>
}

// -----

// i64 states take 64-bit slots (f32 ones would drop half the bits), and so
// does the i32 column beside them; integers compare as signed integers.
// CHECK-LABEL: gpu.func @i64_argmax(
// CHECK-SAME: workgroup(%{{.+}} : memref<16xf64, #gpu.address_space<workgroup>>)
// CHECK-NOT: arith.cmpf
// CHECK: arith.cmpi sgt, %{{.+}} : vector<4xi64>
// CHECK: gpu.shuffle  xor %{{.+}} : i64
// CHECK: arith.bitcast %{{.+}} : i64 to f64
// CHECK: arith.extsi %{{.+}} : i32 to i64
// CHECK: gpu.barrier
// CHECK: arith.bitcast %{{.+}} : f64 to i64
// CHECK: arith.trunci %{{.+}} : i64 to i32
fuse.kernel @i64_argmax(%x: !fuse.full<i64>) -> (y: !fuse.row<i64>) {
  %y = fuse.arg_reduce max %x : !fuse.full<i64> to !fuse.row<i64>
  fuse.yield %y : !fuse.row<i64>
}
