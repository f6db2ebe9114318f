// RUN: tilefuse-opt %s -canonicalize -split-input-file | FileCheck %s

// CHECK-LABEL: fuse.kernel @identities
// CHECK-SAME: (%x: !fuse.full<f32>, %i: !fuse.row<i32>)
fuse.kernel @identities(%x: !fuse.full<f32>, %i: !fuse.row<i32>) -> (a: !fuse.full<f32>, b: !fuse.full<f32>, c: !fuse.full<f32>, d: !fuse.full<f32>, e: !fuse.row<i32>, f: !fuse.row<i32>) {
  %one = fuse.constant scalar 1.000000e+00 : f32
  %neg_zero = fuse.constant scalar -0.000000e+00 : f32
  %zero = fuse.constant scalar 0.000000e+00 : f32
  %one_f = fuse.broadcast %one : !fuse.scalar<f32> to !fuse.full<f32>
  %neg_zero_f = fuse.broadcast %neg_zero : !fuse.scalar<f32> to !fuse.full<f32>
  %zero_f = fuse.broadcast %zero : !fuse.scalar<f32> to !fuse.full<f32>
  %a = fuse.mul %x, %one_f : !fuse.full<f32>
  %b = fuse.add %neg_zero_f, %x : !fuse.full<f32>
  %c = fuse.sub %x, %zero_f : !fuse.full<f32>
  %d = fuse.div %x, %one_f : !fuse.full<f32>
  %zero_i = fuse.constant row 0 : i32
  %one_i = fuse.constant row 1 : i32
  %e = fuse.add %i, %zero_i : !fuse.row<i32>
  %f = fuse.mul %one_i, %i : !fuse.row<i32>
  // CHECK-NOT: fuse.mul
  // CHECK-NOT: fuse.add
  // CHECK-NOT: fuse.sub
  // CHECK-NOT: fuse.div
  // CHECK: fuse.yield %x, %x, %x, %x, %i, %i
  fuse.yield %a, %b, %c, %d, %e, %f : !fuse.full<f32>, !fuse.full<f32>, !fuse.full<f32>, !fuse.full<f32>, !fuse.row<i32>, !fuse.row<i32>
}

// -----

// Folds that would be wrong for some inputs are not done: x + 0.0 turns -0.0
// into +0.0, x - (-0.0) too, and x * 0 is NaN for x = Inf or NaN.
// CHECK-LABEL: fuse.kernel @kept
fuse.kernel @kept(%x: !fuse.full<f32>) -> (a: !fuse.full<f32>, b: !fuse.full<f32>, c: !fuse.full<f32>) {
  // CHECK-DAG: %[[ZERO:.+]] = fuse.constant full 0.000000e+00 : f32
  // CHECK-DAG: %[[NEG_ZERO:.+]] = fuse.constant full -0.000000e+00 : f32
  // CHECK: %[[A:.+]] = fuse.add %x, %[[ZERO]]
  // CHECK: %[[B:.+]] = fuse.sub %x, %[[NEG_ZERO]]
  // CHECK: %[[C:.+]] = fuse.mul %x, %[[ZERO]]
  // CHECK: fuse.yield %[[A]], %[[B]], %[[C]]
  %zero = fuse.constant full 0.000000e+00 : f32
  %neg_zero = fuse.constant full -0.000000e+00 : f32
  %a = fuse.add %x, %zero : !fuse.full<f32>
  %b = fuse.sub %x, %neg_zero : !fuse.full<f32>
  %c = fuse.mul %x, %zero : !fuse.full<f32>
  fuse.yield %a, %b, %c : !fuse.full<f32>, !fuse.full<f32>, !fuse.full<f32>
}

// -----

// CHECK-LABEL: fuse.kernel @constant_folding
fuse.kernel @constant_folding(%x: !fuse.full<f32>) -> (y: !fuse.full<f32>, n: !fuse.scalar<i64>) {
  // CHECK-DAG: %[[SIX:.+]] = fuse.constant full 6.000000e+00 : f32
  // CHECK-DAG: %[[SEVEN:.+]] = fuse.constant scalar 7 : i64
  // CHECK: %[[Y:.+]] = fuse.mul %x, %[[SIX]] : !fuse.full<f32>
  // CHECK: fuse.yield %[[Y]], %[[SEVEN]]
  %two = fuse.constant scalar 2.000000e+00 : f32
  %three = fuse.constant scalar 3.000000e+00 : f32
  %six = fuse.mul %two, %three : !fuse.scalar<f32>
  %six_f = fuse.broadcast %six : !fuse.scalar<f32> to !fuse.full<f32>
  %y = fuse.mul %x, %six_f : !fuse.full<f32>
  %a = fuse.constant scalar 10 : i64
  %b = fuse.constant scalar 3 : i64
  %n = fuse.sub %a, %b : !fuse.scalar<i64>
  fuse.yield %y, %n : !fuse.full<f32>, !fuse.scalar<i64>
}

// -----

// A cast chain folds only when the middle step loses nothing.
// CHECK-LABEL: fuse.kernel @casts
fuse.kernel @casts(%x: !fuse.full<bf16>, %y: !fuse.full<f32>) -> (a: !fuse.full<f16>, b: !fuse.full<f32>, c: !fuse.full<f32>) {
  // CHECK: %[[A:.+]] = fuse.cast %x : !fuse.full<bf16> to !fuse.full<f16>
  // CHECK: %[[NARROW:.+]] = fuse.cast %y : !fuse.full<f32> to !fuse.full<bf16>
  // CHECK: %[[B:.+]] = fuse.cast %[[NARROW]] : !fuse.full<bf16> to !fuse.full<f32>
  // CHECK: fuse.yield %[[A]], %[[B]], %y
  %wide = fuse.cast %x : !fuse.full<bf16> to !fuse.full<f32>
  %a = fuse.cast %wide : !fuse.full<f32> to !fuse.full<f16>
  %narrow = fuse.cast %y : !fuse.full<f32> to !fuse.full<bf16>
  %b = fuse.cast %narrow : !fuse.full<bf16> to !fuse.full<f32>
  %c = fuse.cast %y : !fuse.full<f32> to !fuse.full<f32>
  fuse.yield %a, %b, %c : !fuse.full<f16>, !fuse.full<f32>, !fuse.full<f32>
}

// -----

// CHECK-LABEL: fuse.kernel @broadcasts_and_negation
fuse.kernel @broadcasts_and_negation(%s: !fuse.scalar<f32>, %x: !fuse.full<f32>) -> (a: !fuse.full<f32>, b: !fuse.full<f32>) {
  // CHECK: %[[A:.+]] = fuse.broadcast %s : !fuse.scalar<f32> to !fuse.full<f32>
  // CHECK-NOT: fuse.neg
  // CHECK: fuse.yield %[[A]], %x
  %r = fuse.broadcast %s : !fuse.scalar<f32> to !fuse.row<f32>
  %a = fuse.broadcast %r : !fuse.row<f32> to !fuse.full<f32>
  %n = fuse.neg %x : !fuse.full<f32>
  %b = fuse.neg %n : !fuse.full<f32>
  fuse.yield %a, %b : !fuse.full<f32>, !fuse.full<f32>
}

// -----

// Reductions of broadcasts: max/min/mean of copies is the value, a row sum
// of copies is the value times n, a reduction of a broadcast scalar is a
// broadcast of the reduced scalar. A column sum counts rows, unknown until
// run time, so it stays.
// CHECK-LABEL: fuse.kernel @reductions_of_broadcasts
// CHECK-SAME: (%r: !fuse.row<f32>, %c: !fuse.col<f32>, %s: !fuse.scalar<f32>)
fuse.kernel @reductions_of_broadcasts(%r: !fuse.row<f32>, %c: !fuse.col<f32>, %s: !fuse.scalar<f32>) -> (max: !fuse.row<f32>, mean: !fuse.row<f32>, sum: !fuse.row<f32>, col_min: !fuse.col<f32>, col_sum: !fuse.col<f32>, smax: !fuse.row<f32>, ssum: !fuse.row<f32>) {
  // CHECK: %[[N:.+]] = fuse.row_length : !fuse.scalar<f32>
  // CHECK: %[[NR:.+]] = fuse.broadcast %[[N]] : !fuse.scalar<f32> to !fuse.row<f32>
  // CHECK: %[[SUM:.+]] = fuse.mul %r, %[[NR]] : !fuse.row<f32>
  // CHECK: %[[CF:.+]] = fuse.broadcast %c : !fuse.col<f32> to !fuse.full<f32>
  // CHECK: %[[COL_SUM:.+]] = fuse.reduce sum %[[CF]] : !fuse.full<f32> to !fuse.col<f32>
  // CHECK: %[[SMAX:.+]] = fuse.broadcast %s : !fuse.scalar<f32> to !fuse.row<f32>
  // CHECK: %[[N2:.+]] = fuse.row_length : !fuse.scalar<f32>
  // CHECK: %[[SN:.+]] = fuse.mul %s, %[[N2]] : !fuse.scalar<f32>
  // CHECK: %[[SSUM:.+]] = fuse.broadcast %[[SN]] : !fuse.scalar<f32> to !fuse.row<f32>
  // CHECK: fuse.yield %r, %r, %[[SUM]], %c, %[[COL_SUM]], %[[SMAX]], %[[SSUM]]
  %rf = fuse.broadcast %r : !fuse.row<f32> to !fuse.full<f32>
  %max = fuse.reduce max %rf : !fuse.full<f32> to !fuse.row<f32>
  %mean = fuse.reduce mean %rf : !fuse.full<f32> to !fuse.row<f32>
  %sum = fuse.reduce sum %rf : !fuse.full<f32> to !fuse.row<f32>
  %cf = fuse.broadcast %c : !fuse.col<f32> to !fuse.full<f32>
  %col_min = fuse.reduce min %cf : !fuse.full<f32> to !fuse.col<f32>
  %col_sum = fuse.reduce sum %cf : !fuse.full<f32> to !fuse.col<f32>
  %sf = fuse.broadcast %s : !fuse.scalar<f32> to !fuse.full<f32>
  %smax = fuse.reduce max %sf : !fuse.full<f32> to !fuse.row<f32>
  %ssum = fuse.reduce sum %sf : !fuse.full<f32> to !fuse.row<f32>
  fuse.yield %max, %mean, %sum, %col_min, %col_sum, %smax, %ssum : !fuse.row<f32>, !fuse.row<f32>, !fuse.row<f32>, !fuse.col<f32>, !fuse.col<f32>, !fuse.row<f32>, !fuse.row<f32>
}

// -----

// CHECK-LABEL: fuse.kernel @selects
fuse.kernel @selects(%m: !fuse.full<i1>, %x: !fuse.full<f32>, %y: !fuse.full<f32>) -> (a: !fuse.full<f32>, b: !fuse.full<f32>, c: !fuse.full<f32>) {
  // CHECK: fuse.yield %x, %x, %y
  %true = fuse.constant full true
  %false = fuse.constant full false
  %a = fuse.select %m, %x, %x : !fuse.full<f32>
  %b = fuse.select %true, %x, %y : !fuse.full<f32>
  %c = fuse.select %false, %x, %y : !fuse.full<f32>
  fuse.yield %a, %b, %c : !fuse.full<f32>, !fuse.full<f32>, !fuse.full<f32>
}

// -----

// floor and round of a constant fold exactly (round is half to even, as
// torch.round); rounding a rounded value is that value; the first column of
// a broadcast row is its argmax. sin of a constant is not folded: libm and
// the target may round it differently.
// CHECK-LABEL: fuse.kernel @rounding
fuse.kernel @rounding(%x: !fuse.full<f32>, %r: !fuse.row<f32>) -> (a: !fuse.scalar<f32>, b: !fuse.scalar<f32>, c: !fuse.scalar<f32>, d: !fuse.full<f32>, e: !fuse.full<f32>, f: !fuse.row<i64>, g: !fuse.scalar<f32>) {
  // CHECK-DAG: %[[MINUS_THREE:.+]] = fuse.constant scalar -3.000000e+00 : f32
  // CHECK-DAG: %[[TWO:.+]] = fuse.constant scalar 2.000000e+00 : f32
  // CHECK-DAG: %[[MINUS_TWO:.+]] = fuse.constant scalar -2.000000e+00 : f32
  // CHECK-DAG: %[[ZERO:.+]] = fuse.constant row 0 : i64
  // CHECK-DAG: %[[FLOOR:.+]] = fuse.floor %x : !fuse.full<f32>
  // CHECK-DAG: %[[ROUND:.+]] = fuse.round %x : !fuse.full<f32>
  // CHECK-DAG: %[[SIN:.+]] = fuse.sin
  // CHECK: fuse.yield %[[MINUS_THREE]], %[[TWO]], %[[MINUS_TWO]], %[[FLOOR]], %[[ROUND]], %[[ZERO]], %[[SIN]]
  %c = fuse.constant scalar -2.500000e+00 : f32
  %a = fuse.floor %c : !fuse.scalar<f32>
  %c2 = fuse.constant scalar 2.500000e+00 : f32
  %b = fuse.round %c2 : !fuse.scalar<f32>
  %c_ = fuse.round %c : !fuse.scalar<f32>
  %f1 = fuse.floor %x : !fuse.full<f32>
  %d = fuse.round %f1 : !fuse.full<f32>
  %r1 = fuse.round %x : !fuse.full<f32>
  %e = fuse.floor %r1 : !fuse.full<f32>
  %wide = fuse.broadcast %r : !fuse.row<f32> to !fuse.full<f32>
  %f = fuse.arg_reduce max %wide : !fuse.full<f32> to !fuse.row<i64>
  %g = fuse.sin %c : !fuse.scalar<f32>
  fuse.yield %a, %b, %c_, %d, %e, %f, %g : !fuse.scalar<f32>, !fuse.scalar<f32>, !fuse.scalar<f32>, !fuse.full<f32>, !fuse.full<f32>, !fuse.row<i64>, !fuse.scalar<f32>
}
