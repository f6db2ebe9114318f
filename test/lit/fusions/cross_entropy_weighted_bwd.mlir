// RUN: grep -v -e '^ *//' -e '^$' %s > %t.expected
// RUN: tilefuse-opt %s | grep -v '^$' > %t.printed
// RUN: diff -u %t.expected %t.printed
// RUN: tilefuse-opt %s | tilefuse-opt | grep -v '^$' | diff -u %t.expected -
// RUN: tilefuse-opt %s -canonicalize -fuse-hoist-broadcasts | grep -v '^$' | diff -u %t.expected -
//
// Cross-entropy backward over class indices with class weights w, from the
// forward's m = max(z), logS = log(sum(exp(z - m))) and mass, and the
// upstream gradients of each row's loss (dloss) and z-loss (dz_loss),
// both taken as 0 where target == ignore_index:
//   p = exp(z - m) * exp(-logS), lse = m + logS
//   dz = p * (dloss * mass + 2 * lse_square_scale * dz_loss * lse)
//        - dloss * ((1 - eps) * w[target] * onehot(target) + eps / n * w)
//
// Here z is the logits themselves.
module {
  fuse.kernel @cross_entropy_weighted_bwd(%logits: !fuse.full<f32>, %target: !fuse.row<i64>, %weight: !fuse.col<f32>, %target_weight: !fuse.row<f32>, %max: !fuse.row<f32>, %log_sum: !fuse.row<f32>, %mass: !fuse.row<f32>, %dloss: !fuse.row<f32>, %dz_loss: !fuse.row<f32>, %ignore_index: !fuse.scalar<i64>, %label_smoothing: !fuse.scalar<f32>, %lse_square_scale: !fuse.scalar<f32>) -> (dlogits: !fuse.full<f32>) {
    %0 = fuse.constant row 0.000000e+00 : f32
    %1 = fuse.constant scalar 2.000000e+00 : f32
    %2 = fuse.constant scalar 1.000000e+00 : f32
    %3 = fuse.sub %2, %label_smoothing : !fuse.scalar<f32>
    %4 = fuse.row_length : !fuse.scalar<f32>
    %5 = fuse.div %label_smoothing, %4 : !fuse.scalar<f32>
    %6 = fuse.broadcast %ignore_index : !fuse.scalar<i64> to !fuse.row<i64>
    %7 = fuse.cmp ne, %target, %6 : !fuse.row<i64>
    %8 = fuse.broadcast %max : !fuse.row<f32> to !fuse.full<f32>
    %9 = fuse.sub %logits, %8 : !fuse.full<f32>
    %10 = fuse.add %max, %log_sum : !fuse.row<f32>
    %11 = fuse.exp %9 : !fuse.full<f32>
    %12 = fuse.iota : !fuse.col<i64>
    %13 = fuse.broadcast %12 : !fuse.col<i64> to !fuse.full<i64>
    %14 = fuse.broadcast %target : !fuse.row<i64> to !fuse.full<i64>
    %15 = fuse.cmp eq, %13, %14 : !fuse.full<i64>
    %16 = fuse.cast %15 : !fuse.full<i1> to !fuse.full<f32>
    %17 = fuse.broadcast %5 : !fuse.scalar<f32> to !fuse.col<f32>
    %18 = fuse.mul %17, %weight : !fuse.col<f32>
    %19 = fuse.broadcast %3 : !fuse.scalar<f32> to !fuse.row<f32>
    %20 = fuse.mul %19, %target_weight : !fuse.row<f32>
    %21 = fuse.broadcast %20 : !fuse.row<f32> to !fuse.full<f32>
    %22 = fuse.mul %21, %16 : !fuse.full<f32>
    %23 = fuse.broadcast %18 : !fuse.col<f32> to !fuse.full<f32>
    %24 = fuse.add %22, %23 : !fuse.full<f32>
    %25 = fuse.select %7, %dloss, %0 : !fuse.row<f32>
    %26 = fuse.select %7, %dz_loss, %0 : !fuse.row<f32>
    %27 = fuse.mul %lse_square_scale, %1 : !fuse.scalar<f32>
    %28 = fuse.broadcast %27 : !fuse.scalar<f32> to !fuse.row<f32>
    %29 = fuse.mul %28, %26 : !fuse.row<f32>
    %30 = fuse.mul %29, %10 : !fuse.row<f32>
    %31 = fuse.mul %25, %mass : !fuse.row<f32>
    %32 = fuse.add %31, %30 : !fuse.row<f32>
    %33 = fuse.neg %log_sum : !fuse.row<f32>
    %34 = fuse.exp %33 : !fuse.row<f32>
    %35 = fuse.mul %34, %32 : !fuse.row<f32>
    %36 = fuse.broadcast %25 : !fuse.row<f32> to !fuse.full<f32>
    %37 = fuse.mul %36, %24 : !fuse.full<f32>
    %38 = fuse.broadcast %35 : !fuse.row<f32> to !fuse.full<f32>
    %39 = fuse.mul %11, %38 : !fuse.full<f32>
    %40 = fuse.sub %39, %37 : !fuse.full<f32>
    fuse.yield %40 : !fuse.full<f32>
  }
}
