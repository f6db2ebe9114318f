// RUN: grep -v -e '^ *//' -e '^$' %s > %t.expected
// RUN: tilefuse-opt %s | grep -v '^$' > %t.printed
// RUN: diff -u %t.expected %t.printed
// RUN: tilefuse-opt %s | tilefuse-opt | grep -v '^$' | diff -u %t.expected -
// RUN: tilefuse-opt %s -canonicalize -fuse-hoist-broadcasts | grep -v '^$' | diff -u %t.expected -
//
// Cross-entropy backward over probability targets, from the forward's lse
// and mass and the upstream gradients of each row's loss (dloss) and z-loss
// (dz_loss), with q = (1 - eps) * P + eps / n:
//   p = exp(z - lse)
//   dz = p * (dloss * mass + 2 * lse_square_scale * dz_loss * lse)
//        - dloss * w * q
//
// Here z = softcap * tanh(logits / softcap) (Gemma 2's soft-capping), and the
// gradient with respect to the logits is dz * (1 - tanh(logits / softcap)^2).
// logits / softcap is logits times softcap_reciprocal (1 / softcap, from the
// host).
module {
  fuse.kernel @cross_entropy_probs_capped_bwd(%logits: !fuse.full<f32>, %target: !fuse.full<f32>, %weight: !fuse.col<f32>, %lse: !fuse.row<f32>, %mass: !fuse.row<f32>, %dloss: !fuse.row<f32>, %dz_loss: !fuse.row<f32>, %label_smoothing: !fuse.scalar<f32>, %lse_square_scale: !fuse.scalar<f32>, %softcap: !fuse.scalar<f32>, %softcap_reciprocal: !fuse.scalar<f32>) -> (dlogits: !fuse.full<f32>) {
    %0 = fuse.constant scalar 2.000000e+00 : f32
    %1 = fuse.constant full 1.000000e+00 : f32
    %2 = fuse.constant scalar 1.000000e+00 : f32
    %3 = fuse.broadcast %softcap_reciprocal : !fuse.scalar<f32> to !fuse.full<f32>
    %4 = fuse.broadcast %softcap : !fuse.scalar<f32> to !fuse.full<f32>
    %5 = fuse.mul %logits, %3 : !fuse.full<f32>
    %6 = fuse.tanh %5 : !fuse.full<f32>
    %7 = fuse.mul %4, %6 : !fuse.full<f32>
    %8 = fuse.sub %2, %label_smoothing : !fuse.scalar<f32>
    %9 = fuse.row_length : !fuse.scalar<f32>
    %10 = fuse.div %label_smoothing, %9 : !fuse.scalar<f32>
    %11 = fuse.broadcast %8 : !fuse.scalar<f32> to !fuse.full<f32>
    %12 = fuse.mul %11, %target : !fuse.full<f32>
    %13 = fuse.broadcast %10 : !fuse.scalar<f32> to !fuse.full<f32>
    %14 = fuse.add %12, %13 : !fuse.full<f32>
    %15 = fuse.broadcast %weight : !fuse.col<f32> to !fuse.full<f32>
    %16 = fuse.mul %15, %14 : !fuse.full<f32>
    %17 = fuse.broadcast %lse : !fuse.row<f32> to !fuse.full<f32>
    %18 = fuse.sub %7, %17 : !fuse.full<f32>
    %19 = fuse.exp %18 : !fuse.full<f32>
    %20 = fuse.mul %lse_square_scale, %0 : !fuse.scalar<f32>
    %21 = fuse.broadcast %20 : !fuse.scalar<f32> to !fuse.row<f32>
    %22 = fuse.mul %21, %dz_loss : !fuse.row<f32>
    %23 = fuse.mul %22, %lse : !fuse.row<f32>
    %24 = fuse.mul %dloss, %mass : !fuse.row<f32>
    %25 = fuse.add %24, %23 : !fuse.row<f32>
    %26 = fuse.broadcast %dloss : !fuse.row<f32> to !fuse.full<f32>
    %27 = fuse.mul %26, %16 : !fuse.full<f32>
    %28 = fuse.broadcast %25 : !fuse.row<f32> to !fuse.full<f32>
    %29 = fuse.mul %19, %28 : !fuse.full<f32>
    %30 = fuse.sub %29, %27 : !fuse.full<f32>
    %31 = fuse.mul %7, %3 : !fuse.full<f32>
    %32 = fuse.mul %31, %31 : !fuse.full<f32>
    %33 = fuse.sub %1, %32 : !fuse.full<f32>
    %34 = fuse.mul %30, %33 : !fuse.full<f32>
    fuse.yield %34 : !fuse.full<f32>
  }
}
