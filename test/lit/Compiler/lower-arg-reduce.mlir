// RUN: tilefuse-opt %s --pass-pipeline='builtin.module(fuse.kernel(fuse-specialize{dtype=bf16 n=4096}, fuse-select-tiles{target=sm_90 threads-per-row=64}), fuse-lower-to-gpu, canonicalize, cse)' | FileCheck %s
// RUN: tilefuse-opt %s --pass-pipeline='builtin.module(fuse.kernel(fuse-specialize{dtype=f32 n=1000}, fuse-select-tiles{target=cpu row-on-chip=false}), fuse-lower-to-cpu, canonicalize, cse)' | FileCheck %s --check-prefix=CPU

// argmax and max in one pass: the arg reduction's state is (value, i32
// column), combined lane by lane, across lanes with two shuffles, across
// warps through workgroup slots that hold the column as the bits of a float.
fuse.kernel @argmax(%x: !fuse.full<f32>) -> (index: !fuse.row<i64>, max: !fuse.row<f32>) {
  %i = fuse.arg_reduce max %x : !fuse.full<f32> to !fuse.row<i64>
  %m = fuse.reduce max %x : !fuse.full<f32> to !fuse.row<f32>
  fuse.yield %i, %m : !fuse.row<i64>, !fuse.row<f32>
}

// 4 rows per block x 2 warps per row x 3 state values (value, column, max).
// CHECK: gpu.func @argmax(
// CHECK-SAME: workgroup(%[[WG:.+]] : memref<24xf32, #gpu.address_space<workgroup>>)
// CHECK: arith.cmpf uno
// CHECK: arith.cmpf ogt
// CHECK: arith.cmpi slt
// CHECK: vector.extract
// CHECK: gpu.shuffle  xor %{{.+}} : f32
// CHECK: gpu.shuffle  xor %{{.+}} : i32
// CHECK: arith.bitcast %{{.+}} : i32 to f32
// CHECK: gpu.barrier
// CHECK: arith.bitcast %{{.+}} : f32 to i32
// CHECK: arith.extsi %{{.+}} : i32 to i64
// CHECK: llvm.store %{{.+}} : i64, !llvm.ptr<1>

// Streamed: the loop carries the value and column vectors.
// CPU: func.func @argmax(
// CPU: scf.for {{.+}} iter_args({{.+}}) -> (vector<8xf32>, vector<8xi32>, vector<8xf32>)
// CPU: arith.extsi %{{.+}} : i32 to i64
