// RUN: grep -v -e '^ *//' -e '^$' %s > %t.expected
// RUN: tilefuse-opt %s | grep -v '^$' > %t.printed
// RUN: diff -u %t.expected %t.printed
// RUN: tilefuse-opt %s | tilefuse-opt | grep -v '^$' | diff -u %t.expected -
// RUN: tilefuse-opt %s -canonicalize -fuse-hoist-broadcasts | grep -v '^$' | diff -u %t.expected -
//
// Cross-entropy forward over probability targets P, per row (torch's class
// probabilities with reduction='none', class weights w, label smoothing eps
// over n classes), plus the z-loss. With q = (1 - eps) * P + eps / n,
// m = max(z), s = z - m, logS = log(sum(exp(s))) and lse = m + logS:
//   mass   = sum(w * q)
//   loss   = mass * logS - sum(w * q * s)      (-sum_c w_c q_c log_softmax(z)_c)
//   z_loss = lse_square_scale * lse^2
// A class with q = 0 and a -inf logit makes the loss NaN, as torch's
// 0 * -inf does. m, logS and mass are saved for the backward pass
// (m + logS rounds to m in rows of huge logits).
//
// Here z is the logits themselves.
module {
  fuse.kernel @cross_entropy_probs_fwd(%logits: !fuse.full<f32>, %target: !fuse.full<f32>, %weight: !fuse.col<f32>, %label_smoothing: !fuse.scalar<f32>, %lse_square_scale: !fuse.scalar<f32>) -> (loss: !fuse.row<f32>, z_loss: !fuse.row<f32>, max: !fuse.row<f32>, log_sum: !fuse.row<f32>, mass: !fuse.row<f32>) {
    %0 = fuse.constant scalar 1.000000e+00 : f32
    %1 = fuse.sub %0, %label_smoothing : !fuse.scalar<f32>
    %2 = fuse.row_length : !fuse.scalar<f32>
    %3 = fuse.div %label_smoothing, %2 : !fuse.scalar<f32>
    %4 = fuse.broadcast %1 : !fuse.scalar<f32> to !fuse.full<f32>
    %5 = fuse.mul %4, %target : !fuse.full<f32>
    %6 = fuse.broadcast %3 : !fuse.scalar<f32> to !fuse.full<f32>
    %7 = fuse.add %5, %6 : !fuse.full<f32>
    %8 = fuse.broadcast %weight : !fuse.col<f32> to !fuse.full<f32>
    %9 = fuse.mul %8, %7 : !fuse.full<f32>
    %10 = fuse.reduce max %logits : !fuse.full<f32> to !fuse.row<f32>
    %11 = fuse.broadcast %10 : !fuse.row<f32> to !fuse.full<f32>
    %12 = fuse.sub %logits, %11 : !fuse.full<f32>
    %13 = fuse.exp %12 : !fuse.full<f32>
    %14 = fuse.reduce sum %13 : !fuse.full<f32> to !fuse.row<f32>
    %15 = fuse.log %14 : !fuse.row<f32>
    %16 = fuse.add %10, %15 : !fuse.row<f32>
    %17 = fuse.reduce sum %9 : !fuse.full<f32> to !fuse.row<f32>
    %18 = fuse.mul %9, %12 : !fuse.full<f32>
    %19 = fuse.reduce sum %18 : !fuse.full<f32> to !fuse.row<f32>
    %20 = fuse.mul %17, %15 : !fuse.row<f32>
    %21 = fuse.sub %20, %19 : !fuse.row<f32>
    %22 = fuse.broadcast %lse_square_scale : !fuse.scalar<f32> to !fuse.row<f32>
    %23 = fuse.mul %22, %16 : !fuse.row<f32>
    %24 = fuse.mul %23, %16 : !fuse.row<f32>
    fuse.yield %21, %24, %10, %15, %17 : !fuse.row<f32>, !fuse.row<f32>, !fuse.row<f32>, !fuse.row<f32>, !fuse.row<f32>
  }
}
