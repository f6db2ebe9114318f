// RUN: tilefuse-opt %s -split-input-file --pass-pipeline='builtin.module(fuse.kernel(fuse-merge-reductions))' | FileCheck %s
// RUN: tilefuse-opt %s -split-input-file --pass-pipeline='builtin.module(fuse.kernel(fuse-merge-reductions))' | tilefuse-opt -split-input-file --pass-pipeline='builtin.module(fuse.kernel(fuse-merge-reductions))' | FileCheck %s
// In the compile pipeline it runs after tile selection, on streamed rows and wide rows on chip.
// RUN: tilefuse-opt %s -split-input-file --pass-pipeline='builtin.module(fuse.kernel(fuse-specialize{dtype=bf16 n=262144}, fuse-select-tiles{target=sm_90}, fuse-merge-reductions))' | FileCheck %s --check-prefix=STREAMED
// Rows on chip (64 threads a row of 1024: a loss of two inputs would take one warp and stream).
// RUN: tilefuse-opt %s -split-input-file --pass-pipeline='builtin.module(fuse.kernel(fuse-specialize{dtype=bf16 n=1024}, fuse-select-tiles{target=sm_90 threads-per-row=64}, fuse-merge-reductions))' | FileCheck %s --check-prefix=ONCHIP
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

// A weighted sum about the max (a loss against probability targets:
// sum(w * (x - max))) becomes fuse.max_deviation, computed in the max's
// pass; the max, free of it, merges with its sum of exp: one pass. The sum
// of w the loss also uses is the deviation's sum of weights, and the ops
// are sorted again (the deviation stands where its sum stood, after the
// sum of w's use).
// CHECK-LABEL: fuse.kernel @weighted_deviation
// CHECK-NEXT: %[[MAX:.+]], %[[SUM:.+]] = fuse.max_sum_exp %x
// CHECK-NEXT: %[[LOG:.+]] = fuse.log %[[SUM]]
// CHECK-NEXT: %{{[^,]+}}, %[[DEV:[^,]+]], %[[MASS:[^,]+]] = fuse.max_deviation %x, %w : !fuse.full<f32> to !fuse.row<f32>
// CHECK-NEXT: %[[ML:.+]] = fuse.mul %[[MASS]], %[[LOG]]
// CHECK-NEXT: %[[LOSS:.+]] = fuse.sub %[[ML]], %[[DEV]]
// CHECK-NEXT: fuse.yield %[[LOSS]], %[[MASS]]
// STREAMED-LABEL: fuse.kernel @weighted_deviation
// STREAMED: fuse.max_sum_exp
// STREAMED: fuse.max_deviation
// STREAMED-NOT: fuse.reduce max
// ONCHIP-LABEL: fuse.kernel @weighted_deviation
// ONCHIP-NOT: fuse.max_deviation
// ONCHIP: fuse.reduce max
fuse.kernel @weighted_deviation(%x: !fuse.full<f32>, %w: !fuse.full<f32>) -> (loss: !fuse.row<f32>, mass: !fuse.row<f32>) {
  %max = fuse.reduce max %x : !fuse.full<f32> to !fuse.row<f32>
  %max_f = fuse.broadcast %max : !fuse.row<f32> to !fuse.full<f32>
  %shifted = fuse.sub %x, %max_f : !fuse.full<f32>
  %e = fuse.exp %shifted : !fuse.full<f32>
  %sum = fuse.reduce sum %e : !fuse.full<f32> to !fuse.row<f32>
  %log = fuse.log %sum : !fuse.row<f32>
  %mass = fuse.reduce sum %w : !fuse.full<f32> to !fuse.row<f32>
  %wd = fuse.mul %w, %shifted : !fuse.full<f32>
  %dev = fuse.reduce sum %wd : !fuse.full<f32> to !fuse.row<f32>
  %ml = fuse.mul %mass, %log : !fuse.row<f32>
  %loss = fuse.sub %ml, %dev : !fuse.row<f32>
  fuse.yield %loss, %mass : !fuse.row<f32>, !fuse.row<f32>
}

// -----

// The sum of w right after the weighted sum about the max: the deviation
// takes the place of its sum about the max, just before the sum of w it
// replaces (the walk that erased the sum there freed the op it stood on).
// CHECK-LABEL: fuse.kernel @weights_after_deviation
// CHECK-NEXT: %[[MAX:.+]] = fuse.reduce max %x
// CHECK-NEXT: %{{[^,]+}}, %[[DEV:[^,]+]], %[[MASS:[^,]+]] = fuse.max_deviation %x, %w
// CHECK-NEXT: fuse.yield %[[DEV]], %[[MASS]], %[[MAX]]
// STREAMED-LABEL: fuse.kernel @weights_after_deviation
// STREAMED: fuse.max_deviation
fuse.kernel @weights_after_deviation(%x: !fuse.full<f32>, %w: !fuse.full<f32>) -> (dev: !fuse.row<f32>, mass: !fuse.row<f32>, max: !fuse.row<f32>) {
  %max = fuse.reduce max %x : !fuse.full<f32> to !fuse.row<f32>
  %max_f = fuse.broadcast %max : !fuse.row<f32> to !fuse.full<f32>
  %shifted = fuse.sub %x, %max_f : !fuse.full<f32>
  %p = fuse.mul %w, %shifted : !fuse.full<f32>
  %dev = fuse.reduce sum %p : !fuse.full<f32> to !fuse.row<f32>
  %mass = fuse.reduce sum %w : !fuse.full<f32> to !fuse.row<f32>
  fuse.yield %dev, %mass, %max : !fuse.row<f32>, !fuse.row<f32>, !fuse.row<f32>
}

// -----

// A sum of x - max itself (label smoothing's sum of log-probabilities)
// takes a weight of 1: one pass, and no sum(x) that rows of huge logits
// overflow.
// CHECK-LABEL: fuse.kernel @unit_deviation
// CHECK-NEXT: %[[MAX:.+]], %[[SUM:.+]] = fuse.max_sum_exp %x
// CHECK-NEXT: %[[LOG:.+]] = fuse.log %[[SUM]]
// CHECK-NEXT: %[[ONE:.+]] = fuse.constant full 1.000000e+00 : f32
// CHECK-NEXT: %{{[^,]+}}, %[[DEV:[^,]+]], %{{[^,]+}} = fuse.max_deviation %x, %[[ONE]] : !fuse.full<f32> to !fuse.row<f32>
// CHECK-NEXT: %[[LOSS:.+]] = fuse.sub %[[LOG]], %[[DEV]]
// CHECK-NEXT: fuse.yield %[[LOSS]]
// STREAMED-LABEL: fuse.kernel @unit_deviation
// STREAMED: fuse.max_sum_exp
// STREAMED: fuse.max_deviation
// STREAMED-NOT: fuse.reduce
fuse.kernel @unit_deviation(%x: !fuse.full<f32>) -> (loss: !fuse.row<f32>) {
  %max = fuse.reduce max %x : !fuse.full<f32> to !fuse.row<f32>
  %max_f = fuse.broadcast %max : !fuse.row<f32> to !fuse.full<f32>
  %shifted = fuse.sub %x, %max_f : !fuse.full<f32>
  %e = fuse.exp %shifted : !fuse.full<f32>
  %sum = fuse.reduce sum %e : !fuse.full<f32> to !fuse.row<f32>
  %log = fuse.log %sum : !fuse.row<f32>
  %dev = fuse.reduce sum %shifted : !fuse.full<f32> to !fuse.row<f32>
  %loss = fuse.sub %log, %dev : !fuse.row<f32>
  fuse.yield %loss : !fuse.row<f32>
}

// -----

// The centered value computed (soft-capped logits scaled per column), the
// weight on either side of the product: merged all the same. The max keeps
// its other use.
// CHECK-LABEL: fuse.kernel @capped
// CHECK: %[[T:.+]] = fuse.tanh
// CHECK-NEXT: %[[X:.+]] = fuse.mul %{{.+}}, %[[T]] : !fuse.full<f32>
// CHECK-NEXT: %[[MAX:.+]] = fuse.reduce max %[[X]]
// CHECK-NEXT: %{{[^,]+}}, %[[DEV:[^,]+]], %{{[^,]+}} = fuse.max_deviation %[[X]], %w
// CHECK-NEXT: fuse.yield %[[DEV]], %[[MAX]]
// STREAMED-LABEL: fuse.kernel @capped
// STREAMED: fuse.max_deviation
fuse.kernel @capped(%in: !fuse.full<bf16>, %w: !fuse.full<f32>, %scale: !fuse.col<f32>, %cap: !fuse.scalar<f32>) -> (dev: !fuse.row<f32>, max: !fuse.row<f32>) {
  %x0 = fuse.cast %in : !fuse.full<bf16> to !fuse.full<f32>
  %scale_f = fuse.broadcast %scale : !fuse.col<f32> to !fuse.full<f32>
  %x1 = fuse.mul %x0, %scale_f : !fuse.full<f32>
  %cap_f = fuse.broadcast %cap : !fuse.scalar<f32> to !fuse.full<f32>
  %t = fuse.tanh %x1 : !fuse.full<f32>
  %x = fuse.mul %cap_f, %t : !fuse.full<f32>
  %max = fuse.reduce max %x : !fuse.full<f32> to !fuse.row<f32>
  %max_f = fuse.broadcast %max : !fuse.row<f32> to !fuse.full<f32>
  %shifted = fuse.sub %x, %max_f : !fuse.full<f32>
  %wd = fuse.mul %shifted, %w : !fuse.full<f32>
  %dev = fuse.reduce sum %wd : !fuse.full<f32> to !fuse.row<f32>
  fuse.yield %dev, %max : !fuse.row<f32>, !fuse.row<f32>
}

// -----

// Left alone: centered on another value's max, a mean (not a sum) of exp,
// a weight of the max's own pass (exp(x - max) times x - max), a mean
// (not a sum) of w * (x - max), a weighted sum about another value's max,
// a sum (not a mean) as the centre of a square.
// CHECK-LABEL: fuse.kernel @no_match
// CHECK-NOT: fuse.max_sum_exp
// CHECK-NOT: fuse.moments
// CHECK-NOT: fuse.max_deviation
// CHECK-COUNT-9: fuse.reduce
// CHECK-NOT: fuse.reduce
fuse.kernel @no_match(%x: !fuse.full<f32>, %z: !fuse.full<f32>) -> (a: !fuse.row<f32>, b: !fuse.row<f32>, c: !fuse.row<f32>, d: !fuse.row<f32>, e: !fuse.row<f32>, f: !fuse.row<f32>) {
  %max = fuse.reduce max %z : !fuse.full<f32> to !fuse.row<f32>
  %max_f = fuse.broadcast %max : !fuse.row<f32> to !fuse.full<f32>
  %shifted = fuse.sub %x, %max_f : !fuse.full<f32>
  %e = fuse.exp %shifted : !fuse.full<f32>
  %a = fuse.reduce sum %e : !fuse.full<f32> to !fuse.row<f32>
  %b = fuse.reduce mean %e : !fuse.full<f32> to !fuse.row<f32>
  %xmax = fuse.reduce max %x : !fuse.full<f32> to !fuse.row<f32>
  %xmax_f = fuse.broadcast %xmax : !fuse.row<f32> to !fuse.full<f32>
  %xs = fuse.sub %x, %xmax_f : !fuse.full<f32>
  %xe = fuse.exp %xs : !fuse.full<f32>
  %es = fuse.mul %xe, %xs : !fuse.full<f32>
  %c = fuse.reduce sum %es : !fuse.full<f32> to !fuse.row<f32>
  %zs = fuse.mul %z, %xs : !fuse.full<f32>
  %d = fuse.reduce mean %zs : !fuse.full<f32> to !fuse.row<f32>
  %zx = fuse.mul %z, %shifted : !fuse.full<f32>
  %f = fuse.reduce sum %zx : !fuse.full<f32> to !fuse.row<f32>
  %sum = fuse.reduce sum %x : !fuse.full<f32> to !fuse.row<f32>
  %sum_f = fuse.broadcast %sum : !fuse.row<f32> to !fuse.full<f32>
  %xsum = fuse.sub %x, %sum_f : !fuse.full<f32>
  %sq = fuse.mul %xsum, %xsum : !fuse.full<f32>
  %m2 = fuse.reduce sum %sq : !fuse.full<f32> to !fuse.row<f32>
  fuse.yield %a, %b, %c, %d, %m2, %f : !fuse.row<f32>, !fuse.row<f32>, !fuse.row<f32>, !fuse.row<f32>, !fuse.row<f32>, !fuse.row<f32>
}

// -----

// Integers: the weighted sum about the max stays (exact where it is; the
// merged op is for floats).
// CHECK-LABEL: fuse.kernel @integer_deviation
// CHECK-NOT: fuse.max_deviation
// CHECK: fuse.reduce max %x
// CHECK: fuse.reduce sum
fuse.kernel @integer_deviation(%x: !fuse.full<i64>, %w: !fuse.full<i64>) -> (dev: !fuse.row<i64>) {
  %max = fuse.reduce max %x : !fuse.full<i64> to !fuse.row<i64>
  %max_f = fuse.broadcast %max : !fuse.row<i64> to !fuse.full<i64>
  %shifted = fuse.sub %x, %max_f : !fuse.full<i64>
  %wd = fuse.mul %w, %shifted : !fuse.full<i64>
  %dev = fuse.reduce sum %wd : !fuse.full<i64> to !fuse.row<i64>
  fuse.yield %dev : !fuse.row<i64>
}
