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
// Here z is the logits themselves.
module {
  fuse.kernel @cross_entropy_bwd(%logits: !fuse.full<f32>, %target: !fuse.row<i64>, %lse: !fuse.row<f32>, %dloss: !fuse.row<f32>, %dz_loss: !fuse.row<f32>, %ignore_index: !fuse.scalar<i64>, %label_smoothing: !fuse.scalar<f32>, %lse_square_scale: !fuse.scalar<f32>) -> (dlogits: !fuse.full<f32>) {
    %0 = fuse.constant row 0.000000e+00 : f32
    %1 = fuse.constant scalar 2.000000e+00 : f32
    %2 = fuse.constant scalar 1.000000e+00 : f32
    %3 = fuse.sub %2, %label_smoothing : !fuse.scalar<f32>
    %4 = fuse.row_length : !fuse.scalar<f32>
    %5 = fuse.div %label_smoothing, %4 : !fuse.scalar<f32>
    %6 = fuse.broadcast %ignore_index : !fuse.scalar<i64> to !fuse.row<i64>
    %7 = fuse.cmp ne, %target, %6 : !fuse.row<i64>
    %8 = fuse.broadcast %lse : !fuse.row<f32> to !fuse.full<f32>
    %9 = fuse.sub %logits, %8 : !fuse.full<f32>
    %10 = fuse.exp %9 : !fuse.full<f32>
    %11 = fuse.iota : !fuse.col<i64>
    %12 = fuse.broadcast %11 : !fuse.col<i64> to !fuse.full<i64>
    %13 = fuse.broadcast %target : !fuse.row<i64> to !fuse.full<i64>
    %14 = fuse.cmp eq, %12, %13 : !fuse.full<i64>
    %15 = fuse.cast %14 : !fuse.full<i1> to !fuse.full<f32>
    %16 = fuse.broadcast %3 : !fuse.scalar<f32> to !fuse.full<f32>
    %17 = fuse.mul %16, %15 : !fuse.full<f32>
    %18 = fuse.broadcast %5 : !fuse.scalar<f32> to !fuse.full<f32>
    %19 = fuse.add %17, %18 : !fuse.full<f32>
    %20 = fuse.select %7, %dloss, %0 : !fuse.row<f32>
    %21 = fuse.select %7, %dz_loss, %0 : !fuse.row<f32>
    %22 = fuse.mul %lse_square_scale, %1 : !fuse.scalar<f32>
    %23 = fuse.broadcast %22 : !fuse.scalar<f32> to !fuse.row<f32>
    %24 = fuse.mul %23, %21 : !fuse.row<f32>
    %25 = fuse.mul %24, %lse : !fuse.row<f32>
    %26 = fuse.add %20, %25 : !fuse.row<f32>
    %27 = fuse.broadcast %20 : !fuse.row<f32> to !fuse.full<f32>
    %28 = fuse.mul %27, %19 : !fuse.full<f32>
    %29 = fuse.broadcast %26 : !fuse.row<f32> to !fuse.full<f32>
    %30 = fuse.mul %10, %29 : !fuse.full<f32>
    %31 = fuse.sub %30, %28 : !fuse.full<f32>
    fuse.yield %31 : !fuse.full<f32>
  }
}
