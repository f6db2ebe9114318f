// RUN: grep -v -e '^ *//' -e '^$' %s > %t.expected
// RUN: tilefuse-opt %s | grep -v '^$' > %t.printed
// RUN: diff -u %t.expected %t.printed
// RUN: tilefuse-opt %s | tilefuse-opt | grep -v '^$' | diff -u %t.expected -
// RUN: tilefuse-opt %s -canonicalize -fuse-hoist-broadcasts | grep -v '^$' | diff -u %t.expected -
//
// Cross-entropy backward over probability targets, from the forward's
// m = max(z), logS = log(sum(exp(z - m))) and mass, and the upstream
// gradients of each row's loss (dloss) and z-loss (dz_loss), with
// q = (1 - eps) * P + eps / n:
//   p = exp(z - m) * exp(-logS), lse = m + logS
//   dz = p * (dloss * mass + 2 * lse_square_scale * dz_loss * lse)
//        - dloss * w * q
//
// Here z is the logits themselves.
module {
  fuse.kernel @cross_entropy_probs_bwd(%logits: !fuse.full<f32>, %target: !fuse.full<f32>, %weight: !fuse.col<f32>, %max: !fuse.row<f32>, %log_sum: !fuse.row<f32>, %mass: !fuse.row<f32>, %dloss: !fuse.row<f32>, %dz_loss: !fuse.row<f32>, %label_smoothing: !fuse.scalar<f32>, %lse_square_scale: !fuse.scalar<f32>) -> (dlogits: !fuse.full<f32>) {
    %0 = fuse.constant scalar 2.000000e+00 : f32
    %1 = fuse.constant scalar 1.000000e+00 : f32
    %2 = fuse.sub %1, %label_smoothing : !fuse.scalar<f32>
    %3 = fuse.row_length : !fuse.scalar<f32>
    %4 = fuse.div %label_smoothing, %3 : !fuse.scalar<f32>
    %5 = fuse.broadcast %2 : !fuse.scalar<f32> to !fuse.full<f32>
    %6 = fuse.mul %5, %target : !fuse.full<f32>
    %7 = fuse.broadcast %4 : !fuse.scalar<f32> to !fuse.full<f32>
    %8 = fuse.add %6, %7 : !fuse.full<f32>
    %9 = fuse.broadcast %weight : !fuse.col<f32> to !fuse.full<f32>
    %10 = fuse.mul %9, %8 : !fuse.full<f32>
    %11 = fuse.broadcast %max : !fuse.row<f32> to !fuse.full<f32>
    %12 = fuse.sub %logits, %11 : !fuse.full<f32>
    %13 = fuse.add %max, %log_sum : !fuse.row<f32>
    %14 = fuse.exp %12 : !fuse.full<f32>
    %15 = fuse.mul %lse_square_scale, %0 : !fuse.scalar<f32>
    %16 = fuse.broadcast %15 : !fuse.scalar<f32> to !fuse.row<f32>
    %17 = fuse.mul %16, %dz_loss : !fuse.row<f32>
    %18 = fuse.mul %17, %13 : !fuse.row<f32>
    %19 = fuse.mul %dloss, %mass : !fuse.row<f32>
    %20 = fuse.add %19, %18 : !fuse.row<f32>
    %21 = fuse.neg %log_sum : !fuse.row<f32>
    %22 = fuse.exp %21 : !fuse.row<f32>
    %23 = fuse.mul %22, %20 : !fuse.row<f32>
    %24 = fuse.broadcast %dloss : !fuse.row<f32> to !fuse.full<f32>
    %25 = fuse.mul %24, %10 : !fuse.full<f32>
    %26 = fuse.broadcast %23 : !fuse.row<f32> to !fuse.full<f32>
    %27 = fuse.mul %14, %26 : !fuse.full<f32>
    %28 = fuse.sub %27, %25 : !fuse.full<f32>
    fuse.yield %28 : !fuse.full<f32>
  }
}
