// RUN: grep -v -e '^ *//' -e '^$' %s > %t.expected
// RUN: tilefuse-opt %s | grep -v '^$' > %t.printed
// RUN: diff -u %t.expected %t.printed
// RUN: tilefuse-opt %s | tilefuse-opt | grep -v '^$' | diff -u %t.expected -
// RUN: tilefuse-opt %s -canonicalize -fuse-hoist-broadcasts | grep -v '^$' | diff -u %t.expected -
//
// Cross-entropy backward, from the saved lse and the incoming per-row
// gradient dloss:
//   p = exp(logits - lse)
//   dlogits = dloss * (p - (1 - eps) * onehot(target) - eps / n)
//   dlogits = 0 on rows where target == ignore_index
module {
  fuse.kernel @cross_entropy_bwd(%logits: !fuse.full<f32>, %target: !fuse.row<i64>, %lse: !fuse.row<f32>, %dloss: !fuse.row<f32>, %ignore_index: !fuse.scalar<i64>, %label_smoothing: !fuse.scalar<f32>) -> (dlogits: !fuse.full<f32>) {
    %0 = fuse.constant row 0.000000e+00 : f32
    %1 = fuse.constant scalar 1.000000e+00 : f32
    %2 = fuse.broadcast %lse : !fuse.row<f32> to !fuse.full<f32>
    %3 = fuse.sub %logits, %2 : !fuse.full<f32>
    %4 = fuse.exp %3 : !fuse.full<f32>
    %5 = fuse.iota : !fuse.col<i64>
    %6 = fuse.broadcast %5 : !fuse.col<i64> to !fuse.full<i64>
    %7 = fuse.broadcast %target : !fuse.row<i64> to !fuse.full<i64>
    %8 = fuse.cmp eq, %6, %7 : !fuse.full<i64>
    %9 = fuse.cast %8 : !fuse.full<i1> to !fuse.full<f32>
    %10 = fuse.sub %1, %label_smoothing : !fuse.scalar<f32>
    %11 = fuse.row_length : !fuse.scalar<f32>
    %12 = fuse.div %label_smoothing, %11 : !fuse.scalar<f32>
    %13 = fuse.broadcast %10 : !fuse.scalar<f32> to !fuse.full<f32>
    %14 = fuse.broadcast %12 : !fuse.scalar<f32> to !fuse.full<f32>
    %15 = fuse.mul %13, %9 : !fuse.full<f32>
    %16 = fuse.sub %4, %15 : !fuse.full<f32>
    %17 = fuse.sub %16, %14 : !fuse.full<f32>
    %18 = fuse.broadcast %ignore_index : !fuse.scalar<i64> to !fuse.row<i64>
    %19 = fuse.cmp ne, %target, %18 : !fuse.row<i64>
    %20 = fuse.select %19, %dloss, %0 : !fuse.row<f32>
    %21 = fuse.broadcast %20 : !fuse.row<f32> to !fuse.full<f32>
    %22 = fuse.mul %17, %21 : !fuse.full<f32>
    fuse.yield %22 : !fuse.full<f32>
  }
}
