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
module {
  fuse.kernel @cross_entropy_probs_capped_bwd(%logits: !fuse.full<f32>, %target: !fuse.full<f32>, %weight: !fuse.col<f32>, %lse: !fuse.row<f32>, %mass: !fuse.row<f32>, %dloss: !fuse.row<f32>, %dz_loss: !fuse.row<f32>, %label_smoothing: !fuse.scalar<f32>, %lse_square_scale: !fuse.scalar<f32>, %softcap: !fuse.scalar<f32>) -> (dlogits: !fuse.full<f32>) {
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
    %16 = fuse.broadcast %lse : !fuse.row<f32> to !fuse.full<f32>
    %17 = fuse.sub %6, %16 : !fuse.full<f32>
    %18 = fuse.exp %17 : !fuse.full<f32>
    %19 = fuse.mul %lse_square_scale, %1 : !fuse.scalar<f32>
    %20 = fuse.broadcast %19 : !fuse.scalar<f32> to !fuse.row<f32>
    %21 = fuse.mul %20, %dz_loss : !fuse.row<f32>
    %22 = fuse.mul %21, %lse : !fuse.row<f32>
    %23 = fuse.mul %dloss, %mass : !fuse.row<f32>
    %24 = fuse.add %23, %22 : !fuse.row<f32>
    %25 = fuse.broadcast %dloss : !fuse.row<f32> to !fuse.full<f32>
    %26 = fuse.mul %25, %15 : !fuse.full<f32>
    %27 = fuse.broadcast %24 : !fuse.row<f32> to !fuse.full<f32>
    %28 = fuse.mul %18, %27 : !fuse.full<f32>
    %29 = fuse.sub %28, %26 : !fuse.full<f32>
    %30 = fuse.div %6, %3 : !fuse.full<f32>
    %31 = fuse.mul %30, %30 : !fuse.full<f32>
    %32 = fuse.sub %0, %31 : !fuse.full<f32>
    %33 = fuse.mul %29, %32 : !fuse.full<f32>
    fuse.yield %33 : !fuse.full<f32>
  }
}
