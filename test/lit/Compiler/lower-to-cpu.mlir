// RUN: tilefuse-opt %s --pass-pipeline='builtin.module(fuse.kernel(fuse-specialize{dtype=f32 n=64}, fuse-select-tiles{target=cpu}), fuse-lower-to-cpu, canonicalize, cse)' | FileCheck %s
// RUN: tilefuse-opt %s --pass-pipeline='builtin.module(fuse.kernel(fuse-specialize{dtype=f32 n=4096}, fuse-select-tiles{target=cpu}), fuse-lower-to-cpu, canonicalize, cse)' | FileCheck %s --check-prefix=STREAMED

// The CPU function runs rows [row_begin, row_end) and accumulates the
// column sum into partials row `row_group`; no cross-thread step.

// CHECK: func.func @softmax_colsum(%[[X:.+]]: !llvm.ptr, %[[T:.+]]: f32, %[[Y:.+]]: !llvm.ptr, %[[PARTIALS:.+]]: !llvm.ptr, %[[ROWS:.+]]: i64, %[[BEGIN:.+]]: i64, %[[END:.+]]: i64, %[[GROUP:.+]]: i64)
// CHECK-DAG: %[[B:.+]] = arith.index_cast %[[BEGIN]] : i64 to index
// CHECK-DAG: %[[E:.+]] = arith.index_cast %[[END]] : i64 to index
// CHECK: scf.for %[[ROW:.+]] = %[[B]] to %[[E]]
// On chip (8 chunks of 8): the chunk loop is unrolled, each vector loaded once.
// CHECK-COUNT-8: llvm.load %{{.+}} {alignment = 16 : i64} : !llvm.ptr -> vector<8xf32>
// CHECK-NOT: llvm.load %{{.+}} : !llvm.ptr -> vector<8xf32>
// CHECK: vector.reduction <maximumf>
// CHECK-NOT: gpu.
// CHECK: vector.reduction <add>
// CHECK: return
// CHECK: func.func @softmax_colsum_finalize(%{{.+}}: !llvm.ptr, %{{.+}}: !llvm.ptr, %{{.+}}: i64, %{{.+}}: i64)

// Streamed (512 chunks of 8): each reduction folds its chunks in blocks of
// 16 (loops three deep: 2 x 16 x 16), so a sum's rounding error grows with
// the depth rather than with n; the last pass, with nothing to reduce, is
// one loop. The finalize adds the row groups' partials in blocks too.
// STREAMED: func.func @softmax_colsum(
// STREAMED: scf.for
// STREAMED: scf.for %{{.+}} = %c0 to %c2 step %c1 iter_args(%{{.+}} = %{{.+}}) -> (vector<8xf32>)
// STREAMED: %[[TRIPS:.+]] = arith.minui %{{.+}}, %c16
// STREAMED: scf.for %{{.+}} = %c0 to %[[TRIPS]] step %c1 iter_args(%{{.+}} = %{{.+}}) -> (vector<8xf32>)
// STREAMED: %[[INNER:.+]] = arith.minui %{{.+}}, %c16
// STREAMED: scf.for %{{.+}} = %c0 to %[[INNER]] step %c1 iter_args(%{{.+}} = %{{.+}}) -> (vector<8xf32>)
// STREAMED: vector.reduction <maximumf>
// STREAMED: vector.reduction <add>
// STREAMED: scf.for %{{.+}} = %c0 to %c512 step %c1 {
// STREAMED: func.func @softmax_colsum_finalize(
// STREAMED: arith.ceildivui %{{.+}}, %c1048576
// STREAMED: arith.minui %{{.+}}, %c16
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
