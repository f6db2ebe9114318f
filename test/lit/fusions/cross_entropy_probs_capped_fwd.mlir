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
// Here z = softcap * tanh(logits / softcap) (Gemma 2's soft-capping), and the
// gradient with respect to the logits is dz * (1 - tanh(logits / softcap)^2).
// logits / softcap is logits times softcap_reciprocal (1 / softcap, from the
// host).
module {
  fuse.kernel @cross_entropy_probs_capped_fwd(%logits: !fuse.full<f32>, %target: !fuse.full<f32>, %weight: !fuse.col<f32>, %label_smoothing: !fuse.scalar<f32>, %lse_square_scale: !fuse.scalar<f32>, %softcap: !fuse.scalar<f32>, %softcap_reciprocal: !fuse.scalar<f32>) -> (loss: !fuse.row<f32>, z_loss: !fuse.row<f32>, max: !fuse.row<f32>, log_sum: !fuse.row<f32>, mass: !fuse.row<f32>) {
    %0 = fuse.constant scalar 1.000000e+00 : f32
    %1 = fuse.broadcast %softcap_reciprocal : !fuse.scalar<f32> to !fuse.full<f32>
    %2 = fuse.mul %logits, %1 : !fuse.full<f32>
    %3 = fuse.tanh %2 : !fuse.full<f32>
    %4 = fuse.broadcast %softcap : !fuse.scalar<f32> to !fuse.full<f32>
    %5 = fuse.mul %4, %3 : !fuse.full<f32>
    %6 = fuse.sub %0, %label_smoothing : !fuse.scalar<f32>
    %7 = fuse.row_length : !fuse.scalar<f32>
    %8 = fuse.div %label_smoothing, %7 : !fuse.scalar<f32>
    %9 = fuse.broadcast %6 : !fuse.scalar<f32> to !fuse.full<f32>
    %10 = fuse.mul %9, %target : !fuse.full<f32>
    %11 = fuse.broadcast %8 : !fuse.scalar<f32> to !fuse.full<f32>
    %12 = fuse.add %10, %11 : !fuse.full<f32>
    %13 = fuse.broadcast %weight : !fuse.col<f32> to !fuse.full<f32>
    %14 = fuse.mul %13, %12 : !fuse.full<f32>
    %15 = fuse.reduce max %5 : !fuse.full<f32> to !fuse.row<f32>
    %16 = fuse.broadcast %15 : !fuse.row<f32> to !fuse.full<f32>
    %17 = fuse.sub %5, %16 : !fuse.full<f32>
    %18 = fuse.exp %17 : !fuse.full<f32>
    %19 = fuse.reduce sum %18 : !fuse.full<f32> to !fuse.row<f32>
    %20 = fuse.log %19 : !fuse.row<f32>
    %21 = fuse.add %15, %20 : !fuse.row<f32>
    %22 = fuse.reduce sum %14 : !fuse.full<f32> to !fuse.row<f32>
    %23 = fuse.mul %14, %17 : !fuse.full<f32>
    %24 = fuse.reduce sum %23 : !fuse.full<f32> to !fuse.row<f32>
    %25 = fuse.mul %22, %20 : !fuse.row<f32>
    %26 = fuse.sub %25, %24 : !fuse.row<f32>
    %27 = fuse.broadcast %lse_square_scale : !fuse.scalar<f32> to !fuse.row<f32>
    %28 = fuse.mul %27, %21 : !fuse.row<f32>
    %29 = fuse.mul %28, %21 : !fuse.row<f32>
    fuse.yield %26, %29, %15, %20, %22 : !fuse.row<f32>, !fuse.row<f32>, !fuse.row<f32>, !fuse.row<f32>, !fuse.row<f32>
  }
}
