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
// 0 * -inf does. lse and mass are saved for the backward pass.
//
// Here z = softcap * tanh(logits / softcap) (Gemma 2's soft-capping), and the
// gradient with respect to the logits is dz * (1 - tanh(logits / softcap)^2).
module {
  fuse.kernel @cross_entropy_probs_capped_fwd(%logits: !fuse.full<f32>, %target: !fuse.full<f32>, %weight: !fuse.col<f32>, %label_smoothing: !fuse.scalar<f32>, %lse_square_scale: !fuse.scalar<f32>, %softcap: !fuse.scalar<f32>) -> (loss: !fuse.row<f32>, z_loss: !fuse.row<f32>, lse: !fuse.row<f32>, mass: !fuse.row<f32>) {
    %0 = fuse.constant scalar 1.000000e+00 : f32
    %1 = fuse.broadcast %softcap : !fuse.scalar<f32> to !fuse.full<f32>
    %2 = fuse.div %logits, %1 : !fuse.full<f32>
    %3 = fuse.tanh %2 : !fuse.full<f32>
    %4 = fuse.mul %1, %3 : !fuse.full<f32>
    %5 = fuse.sub %0, %label_smoothing : !fuse.scalar<f32>
    %6 = fuse.row_length : !fuse.scalar<f32>
    %7 = fuse.div %label_smoothing, %6 : !fuse.scalar<f32>
    %8 = fuse.broadcast %5 : !fuse.scalar<f32> to !fuse.full<f32>
    %9 = fuse.mul %8, %target : !fuse.full<f32>
    %10 = fuse.broadcast %7 : !fuse.scalar<f32> to !fuse.full<f32>
    %11 = fuse.add %9, %10 : !fuse.full<f32>
    %12 = fuse.broadcast %weight : !fuse.col<f32> to !fuse.full<f32>
    %13 = fuse.mul %12, %11 : !fuse.full<f32>
    %14 = fuse.reduce max %4 : !fuse.full<f32> to !fuse.row<f32>
    %15 = fuse.broadcast %14 : !fuse.row<f32> to !fuse.full<f32>
    %16 = fuse.sub %4, %15 : !fuse.full<f32>
    %17 = fuse.exp %16 : !fuse.full<f32>
    %18 = fuse.reduce sum %17 : !fuse.full<f32> to !fuse.row<f32>
    %19 = fuse.log %18 : !fuse.row<f32>
    %20 = fuse.add %14, %19 : !fuse.row<f32>
    %21 = fuse.reduce sum %13 : !fuse.full<f32> to !fuse.row<f32>
    %22 = fuse.mul %13, %16 : !fuse.full<f32>
    %23 = fuse.reduce sum %22 : !fuse.full<f32> to !fuse.row<f32>
    %24 = fuse.mul %21, %19 : !fuse.row<f32>
    %25 = fuse.sub %24, %23 : !fuse.row<f32>
    %26 = fuse.broadcast %lse_square_scale : !fuse.scalar<f32> to !fuse.row<f32>
    %27 = fuse.mul %26, %20 : !fuse.row<f32>
    %28 = fuse.mul %27, %20 : !fuse.row<f32>
    fuse.yield %25, %28, %20, %21 : !fuse.row<f32>, !fuse.row<f32>, !fuse.row<f32>, !fuse.row<f32>
  }
}
