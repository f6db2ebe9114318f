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
// Here z = softcap * tanh(logits / softcap) (Gemma 2's soft-capping), and the
// gradient with respect to the logits is dz * (1 - tanh(logits / softcap)^2).
// logits / softcap is logits times softcap_reciprocal (1 / softcap, from the
// host).
module {
  fuse.kernel @cross_entropy_probs_capped_bwd(%logits: !fuse.full<f32>, %target: !fuse.full<f32>, %weight: !fuse.col<f32>, %max: !fuse.row<f32>, %log_sum: !fuse.row<f32>, %mass: !fuse.row<f32>, %dloss: !fuse.row<f32>, %dz_loss: !fuse.row<f32>, %label_smoothing: !fuse.scalar<f32>, %lse_square_scale: !fuse.scalar<f32>, %softcap: !fuse.scalar<f32>, %softcap_reciprocal: !fuse.scalar<f32>) -> (dlogits: !fuse.full<f32>) {
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
    %17 = fuse.broadcast %max : !fuse.row<f32> to !fuse.full<f32>
    %18 = fuse.sub %7, %17 : !fuse.full<f32>
    %19 = fuse.add %max, %log_sum : !fuse.row<f32>
    %20 = fuse.exp %18 : !fuse.full<f32>
    %21 = fuse.mul %lse_square_scale, %1 : !fuse.scalar<f32>
    %22 = fuse.broadcast %21 : !fuse.scalar<f32> to !fuse.row<f32>
    %23 = fuse.mul %22, %dz_loss : !fuse.row<f32>
    %24 = fuse.mul %23, %19 : !fuse.row<f32>
    %25 = fuse.mul %dloss, %mass : !fuse.row<f32>
    %26 = fuse.add %25, %24 : !fuse.row<f32>
    %27 = fuse.neg %log_sum : !fuse.row<f32>
    %28 = fuse.exp %27 : !fuse.row<f32>
    %29 = fuse.mul %28, %26 : !fuse.row<f32>
    %30 = fuse.broadcast %dloss : !fuse.row<f32> to !fuse.full<f32>
    %31 = fuse.mul %30, %16 : !fuse.full<f32>
    %32 = fuse.broadcast %29 : !fuse.row<f32> to !fuse.full<f32>
    %33 = fuse.mul %20, %32 : !fuse.full<f32>
    %34 = fuse.sub %33, %31 : !fuse.full<f32>
    %35 = fuse.broadcast %softcap_reciprocal : !fuse.scalar<f32> to !fuse.full<f32>
    %36 = fuse.mul %7, %35 : !fuse.full<f32>
    %37 = fuse.mul %36, %36 : !fuse.full<f32>
    %38 = fuse.sub %0, %37 : !fuse.full<f32>
    %39 = fuse.mul %34, %38 : !fuse.full<f32>
    fuse.yield %39 : !fuse.full<f32>
  }
}
