// RUN: tilefuse-opt %s -fuse-hoist-broadcasts -split-input-file | FileCheck %s
// RUN: tilefuse-opt %s -fuse-hoist-broadcasts -split-input-file | tilefuse-opt -split-input-file -fuse-hoist-broadcasts | FileCheck %s

// A per-row times a scalar is computed per row, then broadcast once.
// CHECK-LABEL: fuse.kernel @row_times_scalar
fuse.kernel @row_times_scalar(%r: !fuse.row<f32>, %s: !fuse.scalar<f32>) -> (y: !fuse.full<f32>) {
  // CHECK: %[[SR:.+]] = fuse.broadcast %s : !fuse.scalar<f32> to !fuse.row<f32>
  // CHECK: %[[P:.+]] = fuse.mul %r, %[[SR]] : !fuse.row<f32>
  // CHECK: %[[Y:.+]] = fuse.broadcast %[[P]] : !fuse.row<f32> to !fuse.full<f32>
  // CHECK: fuse.yield %[[Y]]
  %a = fuse.broadcast %r : !fuse.row<f32> to !fuse.full<f32>
  %b = fuse.broadcast %s : !fuse.scalar<f32> to !fuse.full<f32>
  %y = fuse.mul %a, %b : !fuse.full<f32>
  fuse.yield %y : !fuse.full<f32>
}

// -----

// Chains hoist all the way down: Adam's bias correction is scalar work.
// CHECK-LABEL: fuse.kernel @scalar_chain
fuse.kernel @scalar_chain(%x: !fuse.full<f32>, %beta: !fuse.scalar<f32>, %step: !fuse.scalar<f32>) -> (y: !fuse.full<f32>) {
  // CHECK: %[[ONE:.+]] = fuse.constant scalar 1.000000e+00 : f32
  // CHECK: %[[POW:.+]] = fuse.pow %beta, %step : !fuse.scalar<f32>
  // CHECK: %[[BC:.+]] = fuse.sub %[[ONE]], %[[POW]] : !fuse.scalar<f32>
  // CHECK: %[[BCF:.+]] = fuse.broadcast %[[BC]] : !fuse.scalar<f32> to !fuse.full<f32>
  // CHECK: %[[Y:.+]] = fuse.div %x, %[[BCF]] : !fuse.full<f32>
  // CHECK: fuse.yield %[[Y]]
  %one = fuse.constant full 1.000000e+00 : f32
  %beta_f = fuse.broadcast %beta : !fuse.scalar<f32> to !fuse.full<f32>
  %step_f = fuse.broadcast %step : !fuse.scalar<f32> to !fuse.full<f32>
  %pow = fuse.pow %beta_f, %step_f : !fuse.full<f32>
  %bc = fuse.sub %one, %pow : !fuse.full<f32>
  %y = fuse.div %x, %bc : !fuse.full<f32>
  fuse.yield %y : !fuse.full<f32>
}

// -----

// Per-row and per-column join at full: nothing to hoist. Comparisons and
// selects hoist like arithmetic.
// CHECK-LABEL: fuse.kernel @row_and_col
fuse.kernel @row_and_col(%r: !fuse.row<f32>, %c: !fuse.col<f32>, %t: !fuse.row<i64>, %ignore: !fuse.scalar<i64>) -> (y: !fuse.full<f32>, m: !fuse.full<i1>) {
  // CHECK: %[[RF:.+]] = fuse.broadcast %r : !fuse.row<f32> to !fuse.full<f32>
  // CHECK: %[[CF:.+]] = fuse.broadcast %c : !fuse.col<f32> to !fuse.full<f32>
  // CHECK: %[[Y:.+]] = fuse.add %[[RF]], %[[CF]] : !fuse.full<f32>
  // CHECK: %[[IR:.+]] = fuse.broadcast %ignore : !fuse.scalar<i64> to !fuse.row<i64>
  // CHECK: %[[NE:.+]] = fuse.cmp ne, %t, %[[IR]] : !fuse.row<i64>
  // CHECK: %[[M:.+]] = fuse.broadcast %[[NE]] : !fuse.row<i1> to !fuse.full<i1>
  // CHECK: fuse.yield %[[Y]], %[[M]]
  %rf = fuse.broadcast %r : !fuse.row<f32> to !fuse.full<f32>
  %cf = fuse.broadcast %c : !fuse.col<f32> to !fuse.full<f32>
  %y = fuse.add %rf, %cf : !fuse.full<f32>
  %tf = fuse.broadcast %t : !fuse.row<i64> to !fuse.full<i64>
  %if = fuse.broadcast %ignore : !fuse.scalar<i64> to !fuse.full<i64>
  %m = fuse.cmp ne, %tf, %if : !fuse.full<i64>
  fuse.yield %y, %m : !fuse.full<f32>, !fuse.full<i1>
}
