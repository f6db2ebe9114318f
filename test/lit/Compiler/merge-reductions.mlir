// RUN: tilefuse-opt %s -split-input-file --pass-pipeline='builtin.module(fuse.kernel(fuse-merge-reductions))' | FileCheck %s
// RUN: tilefuse-opt %s -split-input-file --pass-pipeline='builtin.module(fuse.kernel(fuse-merge-reductions))' | tilefuse-opt -split-input-file --pass-pipeline='builtin.module(fuse.kernel(fuse-merge-reductions))' | FileCheck %s
// In the compile pipeline it runs after tile selection, on streamed rows and wide rows on chip.
// RUN: tilefuse-opt %s -split-input-file --pass-pipeline='builtin.module(fuse.kernel(fuse-specialize{dtype=bf16 n=262144}, fuse-select-tiles{target=sm_90}, fuse-merge-reductions))' | FileCheck %s --check-prefix=STREAMED
// RUN: tilefuse-opt %s -split-input-file --pass-pipeline='builtin.module(fuse.kernel(fuse-specialize{dtype=bf16 n=1024}, fuse-select-tiles{target=sm_90}, fuse-merge-reductions))' | FileCheck %s --check-prefix=ONCHIP
// And on rows on chip that keep more than 32 elements a thread (bf16 n = 32000: 64) where
// merging leaves one pass over the row.
// RUN: tilefuse-opt %s -split-input-file --pass-pipeline='builtin.module(fuse.kernel(fuse-specialize{dtype=bf16 n=32000}, fuse-select-tiles{target=sm_90}, fuse-merge-reductions))' | FileCheck %s --check-prefix=WIDE

// Softmax: max, then the sum of exp(x - max), become one online max/sum.
// exp(x - max) still feeds the output, computed in the next pass.
// CHECK-LABEL: fuse.kernel @softmax
// CHECK: %[[MAX:.+]], %[[SUM:.+]] = fuse.max_sum_exp %x : !fuse.full<f32> to !fuse.row<f32>
// CHECK-NOT: fuse.reduce
// CHECK: %[[MAXF:.+]] = fuse.broadcast %[[MAX]] : !fuse.row<f32> to !fuse.full<f32>
// CHECK: %[[E:.+]] = fuse.exp
// CHECK: %[[SUMF:.+]] = fuse.broadcast %[[SUM]]
// CHECK: fuse.div %[[E]], %[[SUMF]]
// STREAMED-LABEL: fuse.kernel @softmax
// STREAMED: fuse.max_sum_exp
// STREAMED-NOT: fuse.reduce {{max|sum}}
// ONCHIP-LABEL: fuse.kernel @softmax
// ONCHIP-NOT: fuse.max_sum_exp
// ONCHIP: fuse.reduce max
// ONCHIP: fuse.reduce sum
// WIDE-LABEL: fuse.kernel @softmax
// WIDE-SAME: row_on_chip = true
// WIDE-NOT: fuse.max_sum_exp
// WIDE: fuse.reduce max
// WIDE: fuse.reduce sum
fuse.kernel @softmax(%x: !fuse.full<f32>) -> (y: !fuse.full<f32>) {
  %max = fuse.reduce max %x : !fuse.full<f32> to !fuse.row<f32>
  %max_f = fuse.broadcast %max : !fuse.row<f32> to !fuse.full<f32>
  %shifted = fuse.sub %x, %max_f : !fuse.full<f32>
  %e = fuse.exp %shifted : !fuse.full<f32>
  %sum = fuse.reduce sum %e : !fuse.full<f32> to !fuse.row<f32>
  %sum_f = fuse.broadcast %sum : !fuse.row<f32> to !fuse.full<f32>
  %y = fuse.div %e, %sum_f : !fuse.full<f32>
  fuse.yield %y : !fuse.full<f32>
}

// -----

// Cross-entropy's log-sum-exp: the exp chain has no other use and goes; the
// max keeps its other use (lse = max + log(sum)). Other reductions of the
// first level (the mean of the logits) are untouched.
// ONCHIP-LABEL: fuse.kernel @logsumexp
// ONCHIP-NOT: fuse.max_sum_exp
// ONCHIP: fuse.reduce max
// WIDE-LABEL: fuse.kernel @logsumexp
// WIDE-SAME: row_on_chip = true
// WIDE: fuse.max_sum_exp
// WIDE-NOT: fuse.reduce {{max|sum}}
// CHECK-LABEL: fuse.kernel @logsumexp
// CHECK-NEXT: %[[MAX:.+]], %[[SUM:.+]] = fuse.max_sum_exp %x : !fuse.full<f32> to !fuse.row<f32>
// CHECK-NEXT: %[[MEAN:.+]] = fuse.reduce mean %x
// CHECK-NEXT: %[[LOG:.+]] = fuse.log %[[SUM]] : !fuse.row<f32>
// CHECK-NEXT: %[[LSE:.+]] = fuse.add %[[MAX]], %[[LOG]] : !fuse.row<f32>
// CHECK-NEXT: fuse.sub %[[LSE]], %[[MEAN]]
fuse.kernel @logsumexp(%x: !fuse.full<f32>) -> (lse: !fuse.row<f32>, gap: !fuse.row<f32>) {
  %max = fuse.reduce max %x : !fuse.full<f32> to !fuse.row<f32>
  %mean = fuse.reduce mean %x : !fuse.full<f32> to !fuse.row<f32>
  %max_f = fuse.broadcast %max : !fuse.row<f32> to !fuse.full<f32>
  %shifted = fuse.sub %x, %max_f : !fuse.full<f32>
  %e = fuse.exp %shifted : !fuse.full<f32>
  %sum = fuse.reduce sum %e : !fuse.full<f32> to !fuse.row<f32>
  %log = fuse.log %sum : !fuse.row<f32>
  %lse = fuse.add %max, %log : !fuse.row<f32>
  %gap = fuse.sub %lse, %mean : !fuse.row<f32>
  fuse.yield %lse, %gap : !fuse.row<f32>, !fuse.row<f32>
}

// -----

// LayerNorm's mean and variance become Welford/Chan moments; the centered
// value stays for the output.
// CHECK-LABEL: fuse.kernel @layer_norm
// CHECK: %[[MEAN:.+]], %[[VAR:.+]] = fuse.moments mean %x : !fuse.full<f32> to !fuse.row<f32>
// CHECK-NOT: fuse.reduce
// CHECK: %[[MEANF:.+]] = fuse.broadcast %[[MEAN]]
// CHECK: %[[XC:.+]] = fuse.sub %x, %[[MEANF]]
// CHECK: fuse.add %[[VAR]], %{{.+}} : !fuse.row<f32>
// CHECK: fuse.yield %{{.+}}, %[[MEAN]]
// WIDE-LABEL: fuse.kernel @layer_norm
// WIDE-NOT: fuse.moments
// STREAMED-LABEL: fuse.kernel @layer_norm
// STREAMED: fuse.moments mean
// STREAMED-NOT: fuse.reduce
fuse.kernel @layer_norm(%x: !fuse.full<f32>, %eps: !fuse.scalar<f32>) -> (y: !fuse.full<f32>, mean: !fuse.row<f32>) {
  %mean = fuse.reduce mean %x : !fuse.full<f32> to !fuse.row<f32>
  %mean_f = fuse.broadcast %mean : !fuse.row<f32> to !fuse.full<f32>
  %xc = fuse.sub %x, %mean_f : !fuse.full<f32>
  %sq = fuse.mul %xc, %xc : !fuse.full<f32>
  %var = fuse.reduce mean %sq : !fuse.full<f32> to !fuse.row<f32>
  %eps_r = fuse.broadcast %eps : !fuse.scalar<f32> to !fuse.row<f32>
  %v = fuse.add %var, %eps_r : !fuse.row<f32>
  %rstd = fuse.rsqrt %v : !fuse.row<f32>
  %rstd_f = fuse.broadcast %rstd : !fuse.row<f32> to !fuse.full<f32>
  %y = fuse.mul %xc, %rstd_f : !fuse.full<f32>
  fuse.yield %y, %mean : !fuse.full<f32>, !fuse.row<f32>
}

// -----

// A sum of squared deviations (no division by n) keeps its kind.
// CHECK-LABEL: fuse.kernel @sum_of_squares
// STREAMED-LABEL: fuse.kernel @sum_of_squares
// WIDE-LABEL: fuse.kernel @sum_of_squares
// WIDE-SAME: row_on_chip = true
// WIDE: fuse.moments sum
// STREAMED: fuse.moments sum
// CHECK: %{{.+}}, %[[M2:.+]] = fuse.moments sum %x : !fuse.full<f64> to !fuse.row<f64>
// CHECK: fuse.yield %[[M2]]
fuse.kernel @sum_of_squares(%x: !fuse.full<f64>) -> (m2: !fuse.row<f64>) {
  %mean = fuse.reduce mean %x : !fuse.full<f64> to !fuse.row<f64>
  %mean_f = fuse.broadcast %mean : !fuse.row<f64> to !fuse.full<f64>
  %xc = fuse.sub %x, %mean_f : !fuse.full<f64>
  %sq = fuse.mul %xc, %xc : !fuse.full<f64>
  %m2 = fuse.reduce sum %sq : !fuse.full<f64> to !fuse.row<f64>
  fuse.yield %m2 : !fuse.row<f64>
}

// -----

// Left alone: centered on another value's max, a mean (not a sum) of exp,
// a product of two different centered values, a sum (not a mean) as the
// centre.
// CHECK-LABEL: fuse.kernel @no_match
// CHECK-NOT: fuse.max_sum_exp
// CHECK-NOT: fuse.moments
// CHECK-COUNT-7: fuse.reduce
fuse.kernel @no_match(%x: !fuse.full<f32>, %z: !fuse.full<f32>) -> (a: !fuse.row<f32>, b: !fuse.row<f32>, c: !fuse.row<f32>, d: !fuse.row<f32>) {
  %max = fuse.reduce max %z : !fuse.full<f32> to !fuse.row<f32>
  %max_f = fuse.broadcast %max : !fuse.row<f32> to !fuse.full<f32>
  %shifted = fuse.sub %x, %max_f : !fuse.full<f32>
  %e = fuse.exp %shifted : !fuse.full<f32>
  %a = fuse.reduce sum %e : !fuse.full<f32> to !fuse.row<f32>
  %b = fuse.reduce mean %e : !fuse.full<f32> to !fuse.row<f32>
  %mean = fuse.reduce mean %x : !fuse.full<f32> to !fuse.row<f32>
  %mean_f = fuse.broadcast %mean : !fuse.row<f32> to !fuse.full<f32>
  %xc = fuse.sub %x, %mean_f : !fuse.full<f32>
  %xz = fuse.mul %xc, %z : !fuse.full<f32>
  %c = fuse.reduce mean %xz : !fuse.full<f32> to !fuse.row<f32>
  %sum = fuse.reduce sum %x : !fuse.full<f32> to !fuse.row<f32>
  %sum_f = fuse.broadcast %sum : !fuse.row<f32> to !fuse.full<f32>
  %xs = fuse.sub %x, %sum_f : !fuse.full<f32>
  %sq = fuse.mul %xs, %xs : !fuse.full<f32>
  %d = fuse.reduce sum %sq : !fuse.full<f32> to !fuse.row<f32>
  fuse.yield %a, %b, %c, %d : !fuse.row<f32>, !fuse.row<f32>, !fuse.row<f32>, !fuse.row<f32>
}
