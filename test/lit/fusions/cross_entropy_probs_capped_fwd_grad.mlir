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
// 0 * -inf does. lse and mass are saved for the backward pass.
//
// Backward:
// Cross-entropy backward over probability targets, from the forward's lse
// and mass and the upstream gradients of each row's loss (dloss) and z-loss
// (dz_loss), with q = (1 - eps) * P + eps / n:
//   p = exp(z - lse)
//   dz = p * (dloss * mass + 2 * lse_square_scale * dz_loss * lse)
//        - dloss * w * q
//
// Here z = softcap * tanh(logits / softcap) (Gemma 2's soft-capping), and the
// gradient with respect to the logits is dz * (1 - tanh(logits / softcap)^2).
module {
  fuse.kernel @cross_entropy_probs_capped_fwd_grad(%logits: !fuse.full<f32>, %target: !fuse.full<f32>, %weight: !fuse.col<f32>, %dloss: !fuse.row<f32>, %dz_loss: !fuse.row<f32>, %label_smoothing: !fuse.scalar<f32>, %lse_square_scale: !fuse.scalar<f32>, %softcap: !fuse.scalar<f32>) -> (loss: !fuse.row<f32>, z_loss: !fuse.row<f32>, dlogits: !fuse.full<f32>) {
    %0 = fuse.constant full 1.000000e+00 : f32
    %1 = fuse.constant scalar 2.000000e+00 : f32
    %2 = fuse.constant scalar 1.000000e+00 : f32
    %3 = fuse.broadcast %softcap : !fuse.scalar<f32> to !fuse.full<f32>
    %4 = fuse.div %logits, %3 : !fuse.full<f32>
    %5 = fuse.tanh %4 : !fuse.full<f32>
    %6 = fuse.mul %3, %5 : !fuse.full<f32>
    %7 = fuse.sub %2, %label_smoothing : !fuse.scalar<f32>
    %8 = fuse.row_length : !fuse.scalar<f32>
    %9 = fuse.div %label_smoothing, %8 : !fuse.scalar<f32>
    %10 = fuse.broadcast %7 : !fuse.scalar<f32> to !fuse.full<f32>
    %11 = fuse.mul %10, %target : !fuse.full<f32>
    %12 = fuse.broadcast %9 : !fuse.scalar<f32> to !fuse.full<f32>
    %13 = fuse.add %11, %12 : !fuse.full<f32>
    %14 = fuse.broadcast %weight : !fuse.col<f32> to !fuse.full<f32>
    %15 = fuse.mul %14, %13 : !fuse.full<f32>
    %16 = fuse.reduce max %6 : !fuse.full<f32> to !fuse.row<f32>
    %17 = fuse.broadcast %16 : !fuse.row<f32> to !fuse.full<f32>
    %18 = fuse.sub %6, %17 : !fuse.full<f32>
    %19 = fuse.exp %18 : !fuse.full<f32>
    %20 = fuse.reduce sum %19 : !fuse.full<f32> to !fuse.row<f32>
    %21 = fuse.log %20 : !fuse.row<f32>
    %22 = fuse.add %16, %21 : !fuse.row<f32>
    %23 = fuse.reduce sum %15 : !fuse.full<f32> to !fuse.row<f32>
    %24 = fuse.mul %15, %18 : !fuse.full<f32>
    %25 = fuse.reduce sum %24 : !fuse.full<f32> to !fuse.row<f32>
    %26 = fuse.mul %23, %21 : !fuse.row<f32>
    %27 = fuse.sub %26, %25 : !fuse.row<f32>
    %28 = fuse.broadcast %lse_square_scale : !fuse.scalar<f32> to !fuse.row<f32>
    %29 = fuse.mul %28, %22 : !fuse.row<f32>
    %30 = fuse.mul %29, %22 : !fuse.row<f32>
    %31 = fuse.broadcast %21 : !fuse.row<f32> to !fuse.full<f32>
    %32 = fuse.sub %18, %31 : !fuse.full<f32>
    %33 = fuse.exp %32 : !fuse.full<f32>
    %34 = fuse.mul %lse_square_scale, %1 : !fuse.scalar<f32>
    %35 = fuse.broadcast %34 : !fuse.scalar<f32> to !fuse.row<f32>
    %36 = fuse.mul %35, %dz_loss : !fuse.row<f32>
    %37 = fuse.mul %36, %22 : !fuse.row<f32>
    %38 = fuse.mul %dloss, %23 : !fuse.row<f32>
    %39 = fuse.add %38, %37 : !fuse.row<f32>
    %40 = fuse.broadcast %dloss : !fuse.row<f32> to !fuse.full<f32>
    %41 = fuse.mul %40, %15 : !fuse.full<f32>
    %42 = fuse.broadcast %39 : !fuse.row<f32> to !fuse.full<f32>
    %43 = fuse.mul %33, %42 : !fuse.full<f32>
    %44 = fuse.sub %43, %41 : !fuse.full<f32>
    %45 = fuse.div %6, %3 : !fuse.full<f32>
    %46 = fuse.mul %45, %45 : !fuse.full<f32>
    %47 = fuse.sub %0, %46 : !fuse.full<f32>
    %48 = fuse.mul %44, %47 : !fuse.full<f32>
    fuse.yield %27, %30, %48 : !fuse.row<f32>, !fuse.row<f32>, !fuse.full<f32>
  }
}
