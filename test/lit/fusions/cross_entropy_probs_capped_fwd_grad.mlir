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
// Here z = softcap * tanh(logits / softcap) (Gemma 2's soft-capping), and the
// gradient with respect to the logits is dz * (1 - tanh(logits / softcap)^2).
// logits / softcap is logits times softcap_reciprocal (1 / softcap, from the
// host).
module {
  fuse.kernel @cross_entropy_probs_capped_fwd_grad(%logits: !fuse.full<f32>, %target: !fuse.full<f32>, %weight: !fuse.col<f32>, %dloss: !fuse.row<f32>, %dz_loss: !fuse.row<f32>, %label_smoothing: !fuse.scalar<f32>, %lse_square_scale: !fuse.scalar<f32>, %softcap: !fuse.scalar<f32>, %softcap_reciprocal: !fuse.scalar<f32>) -> (loss: !fuse.row<f32>, z_loss: !fuse.row<f32>, dlogits: !fuse.full<f32>) {
    %0 = fuse.constant full 1.000000e+00 : f32
    %1 = fuse.constant scalar 2.000000e+00 : f32
    %2 = fuse.constant scalar 1.000000e+00 : f32
    %3 = fuse.broadcast %softcap_reciprocal : !fuse.scalar<f32> to !fuse.full<f32>
    %4 = fuse.mul %logits, %3 : !fuse.full<f32>
    %5 = fuse.tanh %4 : !fuse.full<f32>
    %6 = fuse.broadcast %softcap : !fuse.scalar<f32> to !fuse.full<f32>
    %7 = fuse.mul %6, %5 : !fuse.full<f32>
    %8 = fuse.sub %2, %label_smoothing : !fuse.scalar<f32>
    %9 = fuse.row_length : !fuse.scalar<f32>
    %10 = fuse.div %label_smoothing, %9 : !fuse.scalar<f32>
    %11 = fuse.broadcast %8 : !fuse.scalar<f32> to !fuse.full<f32>
    %12 = fuse.mul %11, %target : !fuse.full<f32>
    %13 = fuse.broadcast %10 : !fuse.scalar<f32> to !fuse.full<f32>
    %14 = fuse.add %12, %13 : !fuse.full<f32>
    %15 = fuse.broadcast %weight : !fuse.col<f32> to !fuse.full<f32>
    %16 = fuse.mul %15, %14 : !fuse.full<f32>
    %17 = fuse.reduce max %7 : !fuse.full<f32> to !fuse.row<f32>
    %18 = fuse.broadcast %17 : !fuse.row<f32> to !fuse.full<f32>
    %19 = fuse.sub %7, %18 : !fuse.full<f32>
    %20 = fuse.exp %19 : !fuse.full<f32>
    %21 = fuse.reduce sum %20 : !fuse.full<f32> to !fuse.row<f32>
    %22 = fuse.log %21 : !fuse.row<f32>
    %23 = fuse.add %17, %22 : !fuse.row<f32>
    %24 = fuse.reduce sum %16 : !fuse.full<f32> to !fuse.row<f32>
    %25 = fuse.mul %16, %19 : !fuse.full<f32>
    %26 = fuse.reduce sum %25 : !fuse.full<f32> to !fuse.row<f32>
    %27 = fuse.mul %24, %22 : !fuse.row<f32>
    %28 = fuse.sub %27, %26 : !fuse.row<f32>
    %29 = fuse.broadcast %lse_square_scale : !fuse.scalar<f32> to !fuse.row<f32>
    %30 = fuse.mul %29, %23 : !fuse.row<f32>
    %31 = fuse.mul %30, %23 : !fuse.row<f32>
    %32 = fuse.broadcast %22 : !fuse.row<f32> to !fuse.full<f32>
    %33 = fuse.sub %19, %32 : !fuse.full<f32>
    %34 = fuse.exp %33 : !fuse.full<f32>
    %35 = fuse.mul %lse_square_scale, %1 : !fuse.scalar<f32>
    %36 = fuse.broadcast %35 : !fuse.scalar<f32> to !fuse.row<f32>
    %37 = fuse.mul %36, %dz_loss : !fuse.row<f32>
    %38 = fuse.mul %37, %23 : !fuse.row<f32>
    %39 = fuse.mul %dloss, %24 : !fuse.row<f32>
    %40 = fuse.add %39, %38 : !fuse.row<f32>
    %41 = fuse.broadcast %dloss : !fuse.row<f32> to !fuse.full<f32>
    %42 = fuse.mul %41, %16 : !fuse.full<f32>
    %43 = fuse.broadcast %40 : !fuse.row<f32> to !fuse.full<f32>
    %44 = fuse.mul %34, %43 : !fuse.full<f32>
    %45 = fuse.sub %44, %42 : !fuse.full<f32>
    %46 = fuse.broadcast %softcap_reciprocal : !fuse.scalar<f32> to !fuse.full<f32>
    %47 = fuse.mul %7, %46 : !fuse.full<f32>
    %48 = fuse.mul %47, %47 : !fuse.full<f32>
    %49 = fuse.sub %0, %48 : !fuse.full<f32>
    %50 = fuse.mul %45, %49 : !fuse.full<f32>
    fuse.yield %28, %31, %50 : !fuse.row<f32>, !fuse.row<f32>, !fuse.full<f32>
  }
}
