// RUN: grep -v -e '^ *//' -e '^$' %s > %t.expected
// RUN: tilefuse-opt %s | grep -v '^$' > %t.printed
// RUN: diff -u %t.expected %t.printed
// RUN: tilefuse-opt %s | tilefuse-opt | grep -v '^$' | diff -u %t.expected -
// RUN: tilefuse-opt %s -canonicalize -fuse-hoist-broadcasts | grep -v '^$' | diff -u %t.expected -
//
// Cross-entropy forward, per row (torch.nn.functional.cross_entropy with
// reduction='none'), with ignore_index and label smoothing eps:
//   lse = max + log(sum(exp(logits - max)))
//   loss = (1 - eps) * (lse - logits[target]) + eps * (lse - mean(logits))
//   loss = 0 where target == ignore_index
// lse is saved for the backward pass. An ignored row gathers column 0, so no
// index ever leaves [0, n).
module {
  fuse.kernel @cross_entropy_fwd(%logits: !fuse.full<f32>, %target: !fuse.row<i64>, %ignore_index: !fuse.scalar<i64>, %label_smoothing: !fuse.scalar<f32>) -> (loss: !fuse.row<f32>, lse: !fuse.row<f32>) {
    %0 = fuse.constant row 0 : i64
    %1 = fuse.constant row 0.000000e+00 : f32
    %2 = fuse.constant scalar 1.000000e+00 : f32
    %3 = fuse.reduce max %logits : !fuse.full<f32> to !fuse.row<f32>
    %4 = fuse.broadcast %3 : !fuse.row<f32> to !fuse.full<f32>
    %5 = fuse.sub %logits, %4 : !fuse.full<f32>
    %6 = fuse.exp %5 : !fuse.full<f32>
    %7 = fuse.reduce sum %6 : !fuse.full<f32> to !fuse.row<f32>
    %8 = fuse.log %7 : !fuse.row<f32>
    %9 = fuse.add %3, %8 : !fuse.row<f32>
    %10 = fuse.broadcast %ignore_index : !fuse.scalar<i64> to !fuse.row<i64>
    %11 = fuse.cmp ne, %target, %10 : !fuse.row<i64>
    %12 = fuse.select %11, %target, %0 : !fuse.row<i64>
    %13 = fuse.gather %logits[%12] : !fuse.full<f32>, !fuse.row<i64> -> !fuse.row<f32>
    %14 = fuse.sub %9, %13 : !fuse.row<f32>
    %15 = fuse.reduce mean %logits : !fuse.full<f32> to !fuse.row<f32>
    %16 = fuse.sub %9, %15 : !fuse.row<f32>
    %17 = fuse.sub %2, %label_smoothing : !fuse.scalar<f32>
    %18 = fuse.broadcast %17 : !fuse.scalar<f32> to !fuse.row<f32>
    %19 = fuse.broadcast %label_smoothing : !fuse.scalar<f32> to !fuse.row<f32>
    %20 = fuse.mul %18, %14 : !fuse.row<f32>
    %21 = fuse.mul %19, %16 : !fuse.row<f32>
    %22 = fuse.add %20, %21 : !fuse.row<f32>
    %23 = fuse.select %11, %22, %1 : !fuse.row<f32>
    fuse.yield %23, %9 : !fuse.row<f32>, !fuse.row<f32>
  }
}
