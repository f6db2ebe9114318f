// RUN: tilefuse-opt %s -split-input-file --pass-pipeline='builtin.module(fuse.kernel(fuse-reciprocal-divisions))' | FileCheck %s
// RUN: tilefuse-opt %s -split-input-file --pass-pipeline='builtin.module(fuse.kernel(fuse-reciprocal-divisions))' | tilefuse-opt -split-input-file --pass-pipeline='builtin.module(fuse.kernel(fuse-reciprocal-divisions))' | FileCheck %s

// Softmax's division by its row sum: one reciprocal per row, shared by both
// divisions by the same sum, and a multiplication per element.
// CHECK-LABEL: fuse.kernel @softmax
// CHECK: %[[SUM:.+]] = fuse.reduce sum %[[E:.+]] : !fuse.full<f32> to !fuse.row<f32>
// CHECK-NEXT: %[[ONE:.+]] = fuse.constant row 1.000000e+00 : f32
// CHECK-NEXT: %[[R:.+]] = fuse.div %[[ONE]], %[[SUM]] : !fuse.row<f32>
// CHECK-NEXT: %[[RF:.+]] = fuse.broadcast %[[R]] : !fuse.row<f32> to !fuse.full<f32>
// CHECK-NOT: fuse.div
// CHECK: %[[Y:.+]] = fuse.mul %[[E]], %[[RF]] : !fuse.full<f32>
// CHECK: %[[Z:.+]] = fuse.mul %x, %[[RF]] : !fuse.full<f32>
// CHECK-NOT: fuse.div
// CHECK: fuse.yield %[[Y]], %[[Z]]
fuse.kernel @softmax(%x: !fuse.full<f32>) -> (y: !fuse.full<f32>, z: !fuse.full<f32>) {
  %e = fuse.exp %x : !fuse.full<f32>
  %sum = fuse.reduce sum %e : !fuse.full<f32> to !fuse.row<f32>
  %sum_f = fuse.broadcast %sum : !fuse.row<f32> to !fuse.full<f32>
  %y = fuse.div %e, %sum_f : !fuse.full<f32>
  %z = fuse.div %x, %sum_f : !fuse.full<f32>
  fuse.yield %y, %z : !fuse.full<f32>, !fuse.full<f32>
}

// -----

// A per-row input as the divisor: the reciprocal comes first.
// CHECK-LABEL: fuse.kernel @by_row_input
// CHECK-NEXT: %[[ONE:.+]] = fuse.constant row 1.000000e+00 : f32
// CHECK-NEXT: %[[R:.+]] = fuse.div %[[ONE]], %s : !fuse.row<f32>
// CHECK-NEXT: %[[RF:.+]] = fuse.broadcast %[[R]]
// CHECK: fuse.mul %x, %[[RF]] : !fuse.full<f32>
fuse.kernel @by_row_input(%x: !fuse.full<f32>, %s: !fuse.row<f32>) -> (y: !fuse.full<f32>) {
  %sf = fuse.broadcast %s : !fuse.row<f32> to !fuse.full<f32>
  %y = fuse.div %x, %sf : !fuse.full<f32>
  fuse.yield %y : !fuse.full<f32>
}

// -----

// Left alone: divisions by scalars (they round as PyTorch's do), by full or
// per-column values, per-row quotients (already once per row) and integer
// divisions.
// CHECK-LABEL: fuse.kernel @kept
// CHECK-NOT: fuse.mul
// CHECK-COUNT-5: fuse.div
// CHECK-NOT: fuse.mul
fuse.kernel @kept(%x: !fuse.full<f32>, %a: !fuse.scalar<f32>, %c: !fuse.col<f32>, %s: !fuse.row<f32>, %i: !fuse.full<i32>, %j: !fuse.row<i32>) -> (y: !fuse.full<f32>, u: !fuse.full<f32>, v: !fuse.full<f32>, w: !fuse.row<f32>, k: !fuse.full<i32>) {
  %af = fuse.broadcast %a : !fuse.scalar<f32> to !fuse.full<f32>
  %y = fuse.div %x, %af : !fuse.full<f32>
  %u = fuse.div %x, %x : !fuse.full<f32>
  %cf = fuse.broadcast %c : !fuse.col<f32> to !fuse.full<f32>
  %v = fuse.div %x, %cf : !fuse.full<f32>
  %w = fuse.div %s, %s : !fuse.row<f32>
  %jf = fuse.broadcast %j : !fuse.row<i32> to !fuse.full<i32>
  %k = fuse.div %i, %jf : !fuse.full<i32>
  fuse.yield %y, %u, %v, %w, %k : !fuse.full<f32>, !fuse.full<f32>, !fuse.full<f32>, !fuse.row<f32>, !fuse.full<i32>
}
