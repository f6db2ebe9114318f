// RUN: grep -v -e '^ *//' -e '^$' %s > %t.expected
// RUN: tilefuse-opt %s | grep -v '^$' > %t.printed
// RUN: diff -u %t.expected %t.printed
// RUN: tilefuse-opt %s | tilefuse-opt | grep -v '^$' | diff -u %t.expected -
// RUN: tilefuse-opt %s -canonicalize -fuse-hoist-broadcasts | grep -v '^$' | diff -u %t.expected -
//
// Cross-entropy backward over class indices, from the forward's lse and the
// upstream gradients of each row's loss (dloss) and z-loss (dz_loss), both
// taken as 0 where target == ignore_index, over n classes:
//   p = exp(z - lse)
//   dz = p * (dloss + 2 * lse_square_scale * dz_loss * lse)
//        - dloss * ((1 - eps) * onehot(target) + eps / n)
//
// Here z = softcap * tanh(logits / softcap) (Gemma 2's soft-capping), and the
// gradient with respect to the logits is dz * (1 - tanh(logits / softcap)^2).
module {
  fuse.kernel @cross_entropy_capped_bwd(%logits: !fuse.full<f32>, %target: !fuse.row<i64>, %lse: !fuse.row<f32>, %dloss: !fuse.row<f32>, %dz_loss: !fuse.row<f32>, %ignore_index: !fuse.scalar<i64>, %label_smoothing: !fuse.scalar<f32>, %lse_square_scale: !fuse.scalar<f32>, %softcap: !fuse.scalar<f32>) -> (dlogits: !fuse.full<f32>) {
    %0 = fuse.constant full 1.000000e+00 : f32
    %1 = fuse.constant row 0.000000e+00 : f32
    %2 = fuse.constant scalar 2.000000e+00 : f32
    %3 = fuse.constant scalar 1.000000e+00 : f32
    %4 = fuse.broadcast %softcap : !fuse.scalar<f32> to !fuse.full<f32>
    %5 = fuse.div %logits, %4 : !fuse.full<f32>
    %6 = fuse.tanh %5 : !fuse.full<f32>
    %7 = fuse.mul %4, %6 : !fuse.full<f32>
    %8 = fuse.sub %3, %label_smoothing : !fuse.scalar<f32>
    %9 = fuse.row_length : !fuse.scalar<f32>
    %10 = fuse.div %label_smoothing, %9 : !fuse.scalar<f32>
    %11 = fuse.broadcast %ignore_index : !fuse.scalar<i64> to !fuse.row<i64>
    %12 = fuse.cmp ne, %target, %11 : !fuse.row<i64>
    %13 = fuse.broadcast %lse : !fuse.row<f32> to !fuse.full<f32>
    %14 = fuse.sub %7, %13 : !fuse.full<f32>
    %15 = fuse.exp %14 : !fuse.full<f32>
    %16 = fuse.iota : !fuse.col<i64>
    %17 = fuse.broadcast %16 : !fuse.col<i64> to !fuse.full<i64>
    %18 = fuse.broadcast %target : !fuse.row<i64> to !fuse.full<i64>
    %19 = fuse.cmp eq, %17, %18 : !fuse.full<i64>
    %20 = fuse.cast %19 : !fuse.full<i1> to !fuse.full<f32>
    %21 = fuse.broadcast %8 : !fuse.scalar<f32> to !fuse.full<f32>
    %22 = fuse.mul %21, %20 : !fuse.full<f32>
    %23 = fuse.broadcast %10 : !fuse.scalar<f32> to !fuse.full<f32>
    %24 = fuse.add %22, %23 : !fuse.full<f32>
    %25 = fuse.select %12, %dloss, %1 : !fuse.row<f32>
    %26 = fuse.select %12, %dz_loss, %1 : !fuse.row<f32>
    %27 = fuse.mul %lse_square_scale, %2 : !fuse.scalar<f32>
    %28 = fuse.broadcast %27 : !fuse.scalar<f32> to !fuse.row<f32>
    %29 = fuse.mul %28, %26 : !fuse.row<f32>
    %30 = fuse.mul %29, %lse : !fuse.row<f32>
    %31 = fuse.add %25, %30 : !fuse.row<f32>
    %32 = fuse.broadcast %25 : !fuse.row<f32> to !fuse.full<f32>
    %33 = fuse.mul %32, %24 : !fuse.full<f32>
    %34 = fuse.broadcast %31 : !fuse.row<f32> to !fuse.full<f32>
    %35 = fuse.mul %15, %34 : !fuse.full<f32>
    %36 = fuse.sub %35, %33 : !fuse.full<f32>
    %37 = fuse.div %7, %4 : !fuse.full<f32>
    %38 = fuse.mul %37, %37 : !fuse.full<f32>
    %39 = fuse.sub %0, %38 : !fuse.full<f32>
    %40 = fuse.mul %36, %39 : !fuse.full<f32>
    fuse.yield %40 : !fuse.full<f32>
  }
}
