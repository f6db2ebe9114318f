// RUN: tilefuse-opt %s | tilefuse-opt | FileCheck %s
// RUN: tilefuse-opt %s --mlir-print-op-generic | tilefuse-opt | FileCheck %s

// Every type and op round-trips through the custom assembly and through the
// generic form.

// CHECK-LABEL: fuse.kernel @types
// CHECK-SAME: (%x: !fuse.full<bf16>, %r: !fuse.row<f16>, %c: !fuse.col<f32>, %s: !fuse.scalar<f64>, %m: !fuse.full<i1>, %i: !fuse.row<i32>, %l: !fuse.scalar<i64>)
// CHECK-SAME: -> (out: !fuse.full<bf16>)
fuse.kernel @types(%x: !fuse.full<bf16>, %r: !fuse.row<f16>, %c: !fuse.col<f32>, %s: !fuse.scalar<f64>, %m: !fuse.full<i1>, %i: !fuse.row<i32>, %l: !fuse.scalar<i64>) -> (out: !fuse.full<bf16>) {
  // CHECK: fuse.yield %x : !fuse.full<bf16>
  fuse.yield %x : !fuse.full<bf16>
}

// CHECK-LABEL: fuse.kernel @elementwise
// CHECK-SAME: -> (y: !fuse.full<f32>, k_sum: !fuse.full<i64>)
// CHECK-SAME: attributes {note = "kept"}
fuse.kernel @elementwise(%a: !fuse.full<f32>, %b: !fuse.full<f32>, %k: !fuse.full<i64>) -> (y: !fuse.full<f32>, k_sum: !fuse.full<i64>) attributes {note = "kept"} {
  // CHECK: %[[NEG:.+]] = fuse.neg %a : !fuse.full<f32>
  // CHECK: %[[ABS:.+]] = fuse.abs %[[NEG]] : !fuse.full<f32>
  // CHECK: %[[EXP:.+]] = fuse.exp %[[ABS]] : !fuse.full<f32>
  // CHECK: %[[LOG:.+]] = fuse.log %[[EXP]] : !fuse.full<f32>
  // CHECK: %[[SQRT:.+]] = fuse.sqrt %[[LOG]] : !fuse.full<f32>
  // CHECK: %[[RSQRT:.+]] = fuse.rsqrt %[[SQRT]] : !fuse.full<f32>
  // CHECK: %[[TANH:.+]] = fuse.tanh %[[RSQRT]] : !fuse.full<f32>
  // CHECK: %[[ERF:.+]] = fuse.erf %[[TANH]] : !fuse.full<f32>
  // CHECK: %[[SIG:.+]] = fuse.sigmoid %[[ERF]] : !fuse.full<f32>
  // CHECK: %[[LOG1P:.+]] = fuse.log1p %[[SIG]] : !fuse.full<f32>
  // CHECK: %[[EXPM1:.+]] = fuse.expm1 %[[LOG1P]] : !fuse.full<f32>
  // CHECK: %[[SIN:.+]] = fuse.sin %[[EXPM1]] : !fuse.full<f32>
  // CHECK: %[[COS:.+]] = fuse.cos %[[SIN]] : !fuse.full<f32>
  // CHECK: %[[FLOOR:.+]] = fuse.floor %[[COS]] : !fuse.full<f32>
  // CHECK: %[[ROUND:.+]] = fuse.round %[[COS]] : !fuse.full<f32>
  // CHECK: %[[ROUNDED:.+]] = fuse.add %[[FLOOR]], %[[ROUND]] : !fuse.full<f32>
  // CHECK: %[[ADD:.+]] = fuse.add %[[ROUNDED]], %b : !fuse.full<f32>
  // CHECK: %[[SUB:.+]] = fuse.sub %[[ADD]], %b : !fuse.full<f32>
  // CHECK: %[[MUL:.+]] = fuse.mul %[[SUB]], %b : !fuse.full<f32>
  // CHECK: %[[DIV:.+]] = fuse.div %[[MUL]], %b : !fuse.full<f32>
  // CHECK: %[[MAX:.+]] = fuse.maximum %[[DIV]], %b : !fuse.full<f32>
  // CHECK: %[[MIN:.+]] = fuse.minimum %[[MAX]], %b : !fuse.full<f32>
  // CHECK: %[[POW:.+]] = fuse.pow %[[MIN]], %b : !fuse.full<f32>
  // CHECK: %[[LT:.+]] = fuse.cmp lt, %[[POW]], %b : !fuse.full<f32>
  // CHECK: %[[SEL:.+]] = fuse.select %[[LT]], %[[POW]], %b : !fuse.full<f32>
  // CHECK: %[[KADD:.+]] = fuse.add %k, %k : !fuse.full<i64>
  // CHECK: %[[KNE:.+]] = fuse.cmp ne, %[[KADD]], %k : !fuse.full<i64>
  // CHECK: fuse.yield %[[SEL]], %[[KADD]] : !fuse.full<f32>, !fuse.full<i64>
  %0 = fuse.neg %a : !fuse.full<f32>
  %1 = fuse.abs %0 : !fuse.full<f32>
  %2 = fuse.exp %1 : !fuse.full<f32>
  %3 = fuse.log %2 : !fuse.full<f32>
  %4 = fuse.sqrt %3 : !fuse.full<f32>
  %5 = fuse.rsqrt %4 : !fuse.full<f32>
  %6 = fuse.tanh %5 : !fuse.full<f32>
  %7 = fuse.erf %6 : !fuse.full<f32>
  %8 = fuse.sigmoid %7 : !fuse.full<f32>
  %log1p = fuse.log1p %8 : !fuse.full<f32>
  %expm1 = fuse.expm1 %log1p : !fuse.full<f32>
  %sin = fuse.sin %expm1 : !fuse.full<f32>
  %cos = fuse.cos %sin : !fuse.full<f32>
  %floor = fuse.floor %cos : !fuse.full<f32>
  %round = fuse.round %cos : !fuse.full<f32>
  %rounded = fuse.add %floor, %round : !fuse.full<f32>
  %9 = fuse.add %rounded, %b : !fuse.full<f32>
  %10 = fuse.sub %9, %b : !fuse.full<f32>
  %11 = fuse.mul %10, %b : !fuse.full<f32>
  %12 = fuse.div %11, %b : !fuse.full<f32>
  %13 = fuse.maximum %12, %b : !fuse.full<f32>
  %14 = fuse.minimum %13, %b : !fuse.full<f32>
  %15 = fuse.pow %14, %b : !fuse.full<f32>
  %16 = fuse.cmp lt, %15, %b : !fuse.full<f32>
  %17 = fuse.select %16, %15, %b : !fuse.full<f32>
  %18 = fuse.add %k, %k : !fuse.full<i64>
  %19 = fuse.cmp ne, %18, %k : !fuse.full<i64>
  fuse.yield %17, %18 : !fuse.full<f32>, !fuse.full<i64>
}

// CHECK-LABEL: fuse.kernel @structure
fuse.kernel @structure(%x: !fuse.full<bf16>, %t: !fuse.row<i32>) -> (col_sum: !fuse.col<f32>, picked: !fuse.row<f32>, n: !fuse.scalar<f32>, idx: !fuse.col<i64>, neg_inf: !fuse.row<f32>, flag: !fuse.scalar<i1>) {
  // CHECK: %[[C:.+]] = fuse.constant scalar 2.500000e-01 : f32
  // CHECK: %[[NEG_INF:.+]] = fuse.constant row 0xFF800000 : f32
  // CHECK: %[[TRUE:.+]] = fuse.constant scalar true
  // CHECK: %[[WIDE:.+]] = fuse.cast %x : !fuse.full<bf16> to !fuse.full<f32>
  // CHECK: %[[CB:.+]] = fuse.broadcast %[[C]] : !fuse.scalar<f32> to !fuse.full<f32>
  // CHECK: %[[SCALED:.+]] = fuse.mul %[[WIDE]], %[[CB]] : !fuse.full<f32>
  // CHECK: %[[SUM:.+]] = fuse.reduce sum %[[SCALED]] : !fuse.full<f32> to !fuse.col<f32>
  // CHECK: %[[MAX:.+]] = fuse.reduce max %[[SCALED]] : !fuse.full<f32> to !fuse.row<f32>
  // CHECK: %[[MIN:.+]] = fuse.reduce min %[[SCALED]] : !fuse.full<f32> to !fuse.row<f32>
  // CHECK: %[[MEAN:.+]] = fuse.reduce mean %[[SCALED]] : !fuse.full<f32> to !fuse.row<f32>
  // CHECK: %[[ARGMAX:.+]] = fuse.arg_reduce max %[[SCALED]] : !fuse.full<f32> to !fuse.row<i64>
  // CHECK: %[[ARGMIN:.+]] = fuse.arg_reduce min %[[SCALED]] : !fuse.full<f32> to !fuse.row<i32>
  // CHECK: %[[PICK:.+]] = fuse.gather %[[SCALED]][%t] : !fuse.full<f32>, !fuse.row<i32> -> !fuse.row<f32>
  // CHECK: %[[N:.+]] = fuse.row_length : !fuse.scalar<f32>
  // CHECK: %[[IOTA:.+]] = fuse.iota : !fuse.col<i64>
  // CHECK: fuse.yield %[[SUM]], %[[PICK]], %[[N]], %[[IOTA]], %[[NEG_INF]], %[[TRUE]]
  %c = fuse.constant scalar 2.500000e-01 : f32
  %neg_inf = fuse.constant row 0xFF800000 : f32
  %true = fuse.constant scalar true
  %wide = fuse.cast %x : !fuse.full<bf16> to !fuse.full<f32>
  %cb = fuse.broadcast %c : !fuse.scalar<f32> to !fuse.full<f32>
  %scaled = fuse.mul %wide, %cb : !fuse.full<f32>
  %sum = fuse.reduce sum %scaled : !fuse.full<f32> to !fuse.col<f32>
  %max = fuse.reduce max %scaled : !fuse.full<f32> to !fuse.row<f32>
  %min = fuse.reduce min %scaled : !fuse.full<f32> to !fuse.row<f32>
  %mean = fuse.reduce mean %scaled : !fuse.full<f32> to !fuse.row<f32>
  %argmax = fuse.arg_reduce max %scaled : !fuse.full<f32> to !fuse.row<i64>
  %argmin = fuse.arg_reduce min %scaled : !fuse.full<f32> to !fuse.row<i32>
  %picked = fuse.gather %scaled[%t] : !fuse.full<f32>, !fuse.row<i32> -> !fuse.row<f32>
  %n = fuse.row_length : !fuse.scalar<f32>
  %idx = fuse.iota : !fuse.col<i64>
  fuse.yield %sum, %picked, %n, %idx, %neg_inf, %true : !fuse.col<f32>, !fuse.row<f32>, !fuse.scalar<f32>, !fuse.col<i64>, !fuse.row<f32>, !fuse.scalar<i1>
}

// CHECK-LABEL: fuse.kernel @fma_and_rounding
fuse.kernel @fma_and_rounding(%x: !fuse.full<f32>, %w: !fuse.col<f32>) -> (y: !fuse.full<f32>, r: !fuse.row<f32>) {
  // CHECK: %[[FMA:.+]] = fuse.fma %x, %x, %x : !fuse.full<f32>
  // CHECK: %[[ROUND:.+]] = fuse.round_to_storage %[[FMA]] of %w : !fuse.full<f32>, !fuse.col<f32>
  // CHECK: %[[ROW:.+]] = fuse.round_to_storage %{{.+}} of %x : !fuse.row<f32>, !fuse.full<f32>
  %0 = fuse.fma %x, %x, %x : !fuse.full<f32>
  %1 = fuse.round_to_storage %0 of %w : !fuse.full<f32>, !fuse.col<f32>
  %2 = fuse.reduce sum %1 : !fuse.full<f32> to !fuse.row<f32>
  %3 = fuse.round_to_storage %2 of %x : !fuse.row<f32>, !fuse.full<f32>
  fuse.yield %1, %3 : !fuse.full<f32>, !fuse.row<f32>
}

// The merged row reductions fuse-merge-reductions creates.
// CHECK-LABEL: fuse.kernel @merged
// CHECK: %max, %sum_exp = fuse.max_sum_exp %x : !fuse.full<f32> to !fuse.row<f32>
// CHECK: %mean, %deviations = fuse.moments sum %x : !fuse.full<f32> to !fuse.row<f32>
// CHECK: %max_0, %deviation, %weights = fuse.max_deviation %x, %w : !fuse.full<f32> to !fuse.row<f32>
fuse.kernel @merged(%x: !fuse.full<f32>, %w: !fuse.full<f32>) -> (s: !fuse.row<f32>, v: !fuse.row<f32>, d: !fuse.row<f32>) {
  %max, %sum_exp = fuse.max_sum_exp %x : !fuse.full<f32> to !fuse.row<f32>
  %mean, %deviations = fuse.moments sum %x : !fuse.full<f32> to !fuse.row<f32>
  %max2, %deviation, %weights = fuse.max_deviation %x, %w : !fuse.full<f32> to !fuse.row<f32>
  fuse.yield %sum_exp, %deviations, %deviation : !fuse.row<f32>, !fuse.row<f32>, !fuse.row<f32>
}
