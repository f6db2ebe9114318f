// RUN: grep -v -e '^ *//' -e '^$' %s > %t.expected
// RUN: tilefuse-opt %s | grep -v '^$' > %t.printed
// RUN: diff -u %t.expected %t.printed
// RUN: tilefuse-opt %s | tilefuse-opt | grep -v '^$' | diff -u %t.expected -
// RUN: tilefuse-opt %s -canonicalize -fuse-hoist-broadcasts | grep -v '^$' | diff -u %t.expected -
//
// Cross-entropy backward over class indices with class weights w, from the
// forward's lse and mass
// and the upstream gradients of each row's loss (dloss) and z-loss (dz_loss),
// both taken as 0 where target == ignore_index:
//   p = exp(z - lse)
//   dz = p * (dloss * mass + 2 * lse_square_scale * dz_loss * lse)
//        - dloss * ((1 - eps) * w[target] * onehot(target) + eps / n * w)
//
// Here z = softcap * tanh(logits / softcap) (Gemma 2's soft-capping), and the
// gradient with respect to the logits is dz * (1 - tanh(logits / softcap)^2).
// logits / softcap is logits times softcap_reciprocal (1 / softcap, from the
// host).
module {
  fuse.kernel @cross_entropy_weighted_capped_bwd(%logits: !fuse.full<f32>, %target: !fuse.row<i64>, %weight: !fuse.col<f32>, %target_weight: !fuse.row<f32>, %lse: !fuse.row<f32>, %mass: !fuse.row<f32>, %dloss: !fuse.row<f32>, %dz_loss: !fuse.row<f32>, %ignore_index: !fuse.scalar<i64>, %label_smoothing: !fuse.scalar<f32>, %lse_square_scale: !fuse.scalar<f32>, %softcap: !fuse.scalar<f32>, %softcap_reciprocal: !fuse.scalar<f32>) -> (dlogits: !fuse.full<f32>) {
    %0 = fuse.constant scalar 2.000000e+00 : f32
    %1 = fuse.constant row 0.000000e+00 : f32
    %2 = fuse.constant full 1.000000e+00 : f32
    %3 = fuse.constant scalar 1.000000e+00 : f32
    %4 = fuse.broadcast %softcap_reciprocal : !fuse.scalar<f32> to !fuse.full<f32>
    %5 = fuse.broadcast %softcap : !fuse.scalar<f32> to !fuse.full<f32>
    %6 = fuse.mul %logits, %4 : !fuse.full<f32>
    %7 = fuse.tanh %6 : !fuse.full<f32>
    %8 = fuse.mul %5, %7 : !fuse.full<f32>
    %9 = fuse.sub %3, %label_smoothing : !fuse.scalar<f32>
    %10 = fuse.row_length : !fuse.scalar<f32>
    %11 = fuse.div %label_smoothing, %10 : !fuse.scalar<f32>
    %12 = fuse.broadcast %ignore_index : !fuse.scalar<i64> to !fuse.row<i64>
    %13 = fuse.cmp ne, %target, %12 : !fuse.row<i64>
    %14 = fuse.broadcast %lse : !fuse.row<f32> to !fuse.full<f32>
    %15 = fuse.sub %8, %14 : !fuse.full<f32>
    %16 = fuse.exp %15 : !fuse.full<f32>
    %17 = fuse.iota : !fuse.col<i64>
    %18 = fuse.broadcast %17 : !fuse.col<i64> to !fuse.full<i64>
    %19 = fuse.broadcast %target : !fuse.row<i64> to !fuse.full<i64>
    %20 = fuse.cmp eq, %18, %19 : !fuse.full<i64>
    %21 = fuse.cast %20 : !fuse.full<i1> to !fuse.full<f32>
    %22 = fuse.broadcast %11 : !fuse.scalar<f32> to !fuse.col<f32>
    %23 = fuse.mul %22, %weight : !fuse.col<f32>
    %24 = fuse.broadcast %9 : !fuse.scalar<f32> to !fuse.row<f32>
    %25 = fuse.mul %24, %target_weight : !fuse.row<f32>
    %26 = fuse.broadcast %25 : !fuse.row<f32> to !fuse.full<f32>
    %27 = fuse.mul %26, %21 : !fuse.full<f32>
    %28 = fuse.broadcast %23 : !fuse.col<f32> to !fuse.full<f32>
    %29 = fuse.add %27, %28 : !fuse.full<f32>
    %30 = fuse.select %13, %dloss, %1 : !fuse.row<f32>
    %31 = fuse.select %13, %dz_loss, %1 : !fuse.row<f32>
    %32 = fuse.mul %lse_square_scale, %0 : !fuse.scalar<f32>
    %33 = fuse.broadcast %32 : !fuse.scalar<f32> to !fuse.row<f32>
    %34 = fuse.mul %33, %31 : !fuse.row<f32>
    %35 = fuse.mul %34, %lse : !fuse.row<f32>
    %36 = fuse.mul %30, %mass : !fuse.row<f32>
    %37 = fuse.add %36, %35 : !fuse.row<f32>
    %38 = fuse.broadcast %30 : !fuse.row<f32> to !fuse.full<f32>
    %39 = fuse.mul %38, %29 : !fuse.full<f32>
    %40 = fuse.broadcast %37 : !fuse.row<f32> to !fuse.full<f32>
    %41 = fuse.mul %16, %40 : !fuse.full<f32>
    %42 = fuse.sub %41, %39 : !fuse.full<f32>
    %43 = fuse.mul %8, %4 : !fuse.full<f32>
    %44 = fuse.mul %43, %43 : !fuse.full<f32>
    %45 = fuse.sub %2, %44 : !fuse.full<f32>
    %46 = fuse.mul %42, %45 : !fuse.full<f32>
    fuse.yield %46 : !fuse.full<f32>
  }
}
