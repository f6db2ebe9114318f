// RUN: tilefuse-opt %s --pass-pipeline='builtin.module(fuse.kernel(fuse-specialize{dtype=bf16 n=2048}, fuse-select-tiles{target=sm_90}), fuse-lower-to-gpu, canonicalize, cse)' | FileCheck %s
// RUN: tilefuse-opt %s --pass-pipeline='builtin.module(fuse.kernel(fuse-specialize{dtype=bf16 n=2048}, fuse-select-tiles{target=sm_90 row-on-chip=false}), fuse-lower-to-gpu, canonicalize, cse)' | FileCheck %s --check-prefix=STREAMED
// Wide rows: 32 columns (a 128-byte line of each partial row) per block, 8
// threads per column; at n = 4096 16 columns (256 blocks), 16 threads.
// RUN: tilefuse-opt %s --pass-pipeline='builtin.module(fuse.kernel(fuse-specialize{dtype=bf16 n=8192}, fuse-select-tiles{target=sm_90}), fuse-lower-to-gpu, canonicalize, cse)' | FileCheck %s --check-prefix=WIDE
// RUN: tilefuse-opt %s --pass-pipeline='builtin.module(fuse.kernel(fuse-specialize{dtype=bf16 n=4096}, fuse-select-tiles{target=sm_90}), fuse-lower-to-gpu, canonicalize, cse)' | FileCheck %s --check-prefix=MEDIUM
// WIDE-LABEL: gpu.func @softmax_colsum_finalize(
// WIDE: arith.remui %{{.+}}, %c32
// WIDE: arith.ceildivui %{{.+}}, %c8
// MEDIUM-LABEL: gpu.func @softmax_colsum_finalize(
// MEDIUM: arith.remui %{{.+}}, %c16
// MEDIUM: arith.ceildivui %{{.+}}, %c16

// A softmax-like row program with a column reduction: one row reduction
// pass (max), one more (sum of exp), then the outputs.

// CHECK: module attributes {gpu.container_module}
// CHECK: gpu.module @tilefuse_kernels
// Inputs (x, then the scalar), outputs (y, then the partials of the column
// sum), rows; workgroup memory for the cross-warp step: 4 rows per block x
// 2 warps per row x 1 reduction per pass.
// CHECK: gpu.func @softmax_colsum(%[[X:.+]]: !llvm.ptr<1>, %[[T:.+]]: f32, %[[Y:.+]]: !llvm.ptr<1>, %[[PARTIALS:.+]]: !llvm.ptr<1>, %[[ROWS:.+]]: i64)
// CHECK-SAME: workgroup(%[[WG:.+]] : memref<8xf32, #gpu.address_space<workgroup>>) kernel
// CHECK-SAME: known_block_size = array<i32: 256, 1, 1>
// Partials start at the identity, then every row iteration of the block.
// CHECK: scf.for
// CHECK: llvm.store %{{.+}}, %{{.+}} {alignment = 16 : i64} : vector<8xf32>, !llvm.ptr<1>
// CHECK: scf.for
// CHECK: %[[VALID:.+]] = arith.cmpi ult
// CHECK: arith.select %[[VALID]]
// CHECK: llvm.load %{{.+}} {alignment = 16 : i64} : !llvm.ptr<1> -> vector<8xbf16>
// CHECK: vector.reduction <maximumf>
// CHECK: gpu.shuffle  xor
// CHECK: gpu.barrier
// CHECK: memref.load %[[WG]]
// CHECK: gpu.barrier
// CHECK: math.exp
// CHECK: vector.reduction <add>
// CHECK: gpu.shuffle  xor
// CHECK: scf.if
// CHECK: llvm.store %{{.+}} {alignment = 16 : i64} : vector<8xbf16>, !llvm.ptr<1>
// CHECK: scf.if
// CHECK: llvm.load %{{.+}} {alignment = 16 : i64} : !llvm.ptr<1> -> vector<8xf32>
// CHECK: llvm.store %{{.+}} {alignment = 16 : i64} : vector<8xf32>, !llvm.ptr<1>
// CHECK: gpu.return
// The final reduction: 8 columns per block at n = 2048 (256 blocks; 32
// would leave 64), 32 threads per column, each combining its contiguous
// share of the row groups in order; after a barrier the first of them
// combines the 32 shares in order.
// CHECK: gpu.func @softmax_colsum_finalize(%{{.+}}: !llvm.ptr<1>, %{{.+}}: !llvm.ptr<1>, %[[GROUPS:.+]]: i64, %{{.+}}: i64) workgroup(%[[SHARES:.+]] : memref<256xf32, #gpu.address_space<workgroup>>) kernel
// CHECK: %[[COLUMN:.+]] = arith.remui %[[THREAD:.+]], %c8
// CHECK: %[[SLICE:.+]] = arith.divui %[[THREAD]], %c8
// CHECK: %[[IN_RANGE:.+]] = arith.cmpi ult, %{{.+}}, %c2048
// CHECK: %[[SHARE:.+]] = arith.ceildivui %{{.+}}, %c32
// CHECK: arith.muli %[[SLICE]], %[[SHARE]]
// CHECK: arith.select %[[IN_RANGE]], %{{.+}}, %c0
// Eight row groups an iteration from one address, at constant offsets
// (a row group is 2048 floats), loaded before they are added; their total
// joins the running one. The loops keep LLVM from unrolling them again.
// The slice's first address is frozen: opaque to loop strength reduction.
// CHECK: %[[FIRST:.+]] = llvm.getelementptr %arg0[%{{.+}}] : (!llvm.ptr<1>, i64) -> !llvm.ptr<1>, f32
// CHECK-NEXT: %[[START:.+]] = llvm.freeze %[[FIRST]] : !llvm.ptr<1>
// CHECK: scf.for
// CHECK: scf.for %{{.+}} iter_args(%[[RUNNING:.+]] = %{{.+}}) -> (f32)
// CHECK: %[[ROWS:.+]] = llvm.getelementptr %[[START]][%{{.+}}] : (!llvm.ptr<1>, i64) -> !llvm.ptr<1>, f32
// CHECK-NEXT: %[[ROW0:.+]] = llvm.load %[[ROWS]] : !llvm.ptr<1> -> f32
// CHECK-NEXT: llvm.getelementptr %[[ROWS]][2048]
// CHECK-NEXT: %[[ROW1:.+]] = llvm.load
// CHECK-COUNT-6: llvm.getelementptr %[[ROWS]][{{[0-9]+}}]
// CHECK-NEXT: llvm.load
// CHECK-NOT: llvm.load
// CHECK: %[[GROUP:.+]] = arith.addf %[[ROW0]], %[[ROW1]] : f32
// CHECK: arith.addf %[[RUNNING]], %{{.+}} : f32
// CHECK: } {llvm.loop_annotation = #[[ROLLED:.+]]}
// CHECK: } {llvm.loop_annotation = #[[ROLLED]]}
// The row groups left over (count % 8), one at a time.
// CHECK: scf.for
// CHECK: llvm.load %{{.+}} : !llvm.ptr<1> -> f32
// CHECK: } {llvm.loop_annotation = #[[ROLLED]]}
// CHECK: memref.store %{{.+}}, %[[SHARES]][%[[THREAD]]]
// CHECK: gpu.barrier
// CHECK: scf.if
// CHECK-COUNT-32: memref.load %[[SHARES]]
// CHECK: arith.truncf %{{.+}} : f32 to bf16

// Streamed: chunks loop with the partial reductions carried.
// STREAMED: scf.for %{{.+}} = %{{.+}} to %{{.+}} step %{{.+}} iter_args(%{{.+}} = %{{.+}}) -> (vector<8xf32>)
// STREAMED: scf.yield %{{.+}} : vector<8xf32>
// STREAMED: gpu.shuffle  xor
fuse.kernel @softmax_colsum(%x: !fuse.full<f32>, %t: !fuse.scalar<f32>) -> (y: !fuse.full<f32>, colsum: !fuse.col<f32>) {
  %max = fuse.reduce max %x : !fuse.full<f32> to !fuse.row<f32>
  %max_f = fuse.broadcast %max : !fuse.row<f32> to !fuse.full<f32>
  %shifted = fuse.sub %x, %max_f : !fuse.full<f32>
  %e = fuse.exp %shifted : !fuse.full<f32>
  %sum = fuse.reduce sum %e : !fuse.full<f32> to !fuse.row<f32>
  %sum_f = fuse.broadcast %sum : !fuse.row<f32> to !fuse.full<f32>
  %y = fuse.div %e, %sum_f : !fuse.full<f32>
  %t_f = fuse.broadcast %t : !fuse.scalar<f32> to !fuse.full<f32>
  %scaled = fuse.mul %y, %t_f : !fuse.full<f32>
  %colsum = fuse.reduce sum %scaled : !fuse.full<f32> to !fuse.col<f32>
  fuse.yield %y, %colsum : !fuse.full<f32>, !fuse.col<f32>
}
