// RUN: grep -v -e '^ *//' -e '^$' %s > %t.expected
// RUN: tilefuse-opt %s | grep -v '^$' > %t.printed
// RUN: diff -u %t.expected %t.printed
// RUN: tilefuse-opt %s | tilefuse-opt | grep -v '^$' | diff -u %t.expected -
// RUN: tilefuse-opt %s -canonicalize -fuse-hoist-broadcasts | grep -v '^$' | diff -u %t.expected -
//
// Forward and backward in one kernel, for upstream gradients known in the
// forward (the in-place gradient and the fused linear cross-entropy write
// dlogits over the logits): loss and z_loss as the forward pass computes them,
// and dlogits as the backward pass does, from this pass's own statistics.
//
// Forward:
// Cross-entropy forward over probability targets P, per row (torch's class
// probabilities with reduction='none', class weights w, label smoothing eps
// over n classes), plus the z-loss. With q = (1 - eps) * P + eps / n,
// m = max(z), s = z - m, logS = log(sum(exp(s))) and lse = m + logS:
//   mass   = sum(w * q)
//   loss   = mass * logS - sum(w * q * s)      (-sum_c w_c q_c log_softmax(z)_c)
//   z_loss = lse_square_scale * lse^2
// A class with q = 0 and a -inf logit makes the loss NaN, as torch's
// 0 * -inf does.
//
// Backward:
// Cross-entropy backward over probability targets, from this pass's
// m = max(z), logS = log(sum(exp(z - m))) and mass, and the upstream
// gradients of each row's loss (dloss) and z-loss (dz_loss), with
// q = (1 - eps) * P + eps / n:
//   p = exp((z - m) - logS), lse = m + logS
//   dz = p * (dloss * mass + 2 * lse_square_scale * dz_loss * lse)
//        - dloss * w * q
//
// Here z is the logits themselves.
module {
  fuse.kernel @cross_entropy_probs_fwd_grad(%logits: !fuse.full<f32>, %target: !fuse.full<f32>, %weight: !fuse.col<f32>, %dloss: !fuse.row<f32>, %dz_loss: !fuse.row<f32>, %label_smoothing: !fuse.scalar<f32>, %lse_square_scale: !fuse.scalar<f32>) -> (loss: !fuse.row<f32>, z_loss: !fuse.row<f32>, dlogits: !fuse.full<f32>) {
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
    %11 = fuse.reduce max %logits : !fuse.full<f32> to !fuse.row<f32>
    %12 = fuse.broadcast %11 : !fuse.row<f32> to !fuse.full<f32>
    %13 = fuse.sub %logits, %12 : !fuse.full<f32>
    %14 = fuse.exp %13 : !fuse.full<f32>
    %15 = fuse.reduce sum %14 : !fuse.full<f32> to !fuse.row<f32>
    %16 = fuse.log %15 : !fuse.row<f32>
    %17 = fuse.add %11, %16 : !fuse.row<f32>
    %18 = fuse.reduce sum %10 : !fuse.full<f32> to !fuse.row<f32>
    %19 = fuse.mul %10, %13 : !fuse.full<f32>
    %20 = fuse.reduce sum %19 : !fuse.full<f32> to !fuse.row<f32>
    %21 = fuse.mul %18, %16 : !fuse.row<f32>
    %22 = fuse.sub %21, %20 : !fuse.row<f32>
    %23 = fuse.broadcast %lse_square_scale : !fuse.scalar<f32> to !fuse.row<f32>
    %24 = fuse.mul %23, %17 : !fuse.row<f32>
    %25 = fuse.mul %24, %17 : !fuse.row<f32>
    %26 = fuse.broadcast %16 : !fuse.row<f32> to !fuse.full<f32>
    %27 = fuse.sub %13, %26 : !fuse.full<f32>
    %28 = fuse.exp %27 : !fuse.full<f32>
    %29 = fuse.mul %lse_square_scale, %0 : !fuse.scalar<f32>
    %30 = fuse.broadcast %29 : !fuse.scalar<f32> to !fuse.row<f32>
    %31 = fuse.mul %30, %dz_loss : !fuse.row<f32>
    %32 = fuse.mul %31, %17 : !fuse.row<f32>
    %33 = fuse.mul %dloss, %18 : !fuse.row<f32>
    %34 = fuse.add %33, %32 : !fuse.row<f32>
    %35 = fuse.broadcast %dloss : !fuse.row<f32> to !fuse.full<f32>
    %36 = fuse.mul %35, %10 : !fuse.full<f32>
    %37 = fuse.broadcast %34 : !fuse.row<f32> to !fuse.full<f32>
    %38 = fuse.mul %28, %37 : !fuse.full<f32>
    %39 = fuse.sub %38, %36 : !fuse.full<f32>
    fuse.yield %22, %25, %39 : !fuse.row<f32>, !fuse.row<f32>, !fuse.full<f32>
  }
}
