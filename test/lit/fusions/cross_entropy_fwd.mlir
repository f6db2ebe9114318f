// RUN: grep -v -e '^ *//' -e '^$' %s > %t.expected
// RUN: tilefuse-opt %s | grep -v '^$' > %t.printed
// RUN: diff -u %t.expected %t.printed
// RUN: tilefuse-opt %s | tilefuse-opt | grep -v '^$' | diff -u %t.expected -
// RUN: tilefuse-opt %s -canonicalize -fuse-hoist-broadcasts | grep -v '^$' | diff -u %t.expected -
//
// Cross-entropy forward over class indices, per row (torch.nn.functional.
// cross_entropy with reduction='none', ignore_index and label smoothing eps),
// plus the z-loss. With m = max(z), logS = log(sum(exp(z - m))) and
// lse = m + logS:
//   nll    = logS - (z[target] - m)
//   loss   = (1 - eps) * nll + (eps != 0 ? eps * (logS - sum(z - m) / n) : 0)
//   z_loss = lse_square_scale * lse^2
// both 0 where target == ignore_index. As in torch, the smoothing term is
// left out when eps is 0 (a -inf logit makes it inf). m and logS are saved
// for the backward pass (m + logS rounds to m in rows of huge logits). An
// ignored row gathers column 0, so no index ever leaves [0, n).
// The smoothing sums are about m, as torch's log_softmax takes them (sum(z)
// overflows in rows of huge logits); fuse-merge-reductions puts them in
// m's pass.
//
// Here z is the logits themselves.
module {
  fuse.kernel @cross_entropy_fwd(%logits: !fuse.full<f32>, %target: !fuse.row<i64>, %ignore_index: !fuse.scalar<i64>, %label_smoothing: !fuse.scalar<f32>, %lse_square_scale: !fuse.scalar<f32>) -> (loss: !fuse.row<f32>, z_loss: !fuse.row<f32>, max: !fuse.row<f32>, log_sum: !fuse.row<f32>) {
    %0 = fuse.constant row 0.000000e+00 : f32
    %1 = fuse.constant row 0 : i64
    %2 = fuse.constant scalar 0.000000e+00 : f32
    %3 = fuse.constant scalar 1.000000e+00 : f32
    %4 = fuse.sub %3, %label_smoothing : !fuse.scalar<f32>
    %5 = fuse.broadcast %ignore_index : !fuse.scalar<i64> to !fuse.row<i64>
    %6 = fuse.cmp ne, %target, %5 : !fuse.row<i64>
    %7 = fuse.reduce max %logits : !fuse.full<f32> to !fuse.row<f32>
    %8 = fuse.broadcast %7 : !fuse.row<f32> to !fuse.full<f32>
    %9 = fuse.sub %logits, %8 : !fuse.full<f32>
    %10 = fuse.exp %9 : !fuse.full<f32>
    %11 = fuse.reduce sum %10 : !fuse.full<f32> to !fuse.row<f32>
    %12 = fuse.log %11 : !fuse.row<f32>
    %13 = fuse.add %7, %12 : !fuse.row<f32>
    %14 = fuse.select %6, %target, %1 : !fuse.row<i64>
    %15 = fuse.gather %logits[%14] : !fuse.full<f32>, !fuse.row<i64> -> !fuse.row<f32>
    %16 = fuse.sub %15, %7 : !fuse.row<f32>
    %17 = fuse.sub %12, %16 : !fuse.row<f32>
    %18 = fuse.row_length : !fuse.scalar<f32>
    %19 = fuse.reduce sum %9 : !fuse.full<f32> to !fuse.row<f32>
    %20 = fuse.broadcast %18 : !fuse.scalar<f32> to !fuse.row<f32>
    %21 = fuse.div %19, %20 : !fuse.row<f32>
    %22 = fuse.sub %12, %21 : !fuse.row<f32>
    %23 = fuse.broadcast %label_smoothing : !fuse.scalar<f32> to !fuse.row<f32>
    %24 = fuse.mul %23, %22 : !fuse.row<f32>
    %25 = fuse.cmp ne, %label_smoothing, %2 : !fuse.scalar<f32>
    %26 = fuse.broadcast %25 : !fuse.scalar<i1> to !fuse.row<i1>
    %27 = fuse.select %26, %24, %0 : !fuse.row<f32>
    %28 = fuse.broadcast %4 : !fuse.scalar<f32> to !fuse.row<f32>
    %29 = fuse.mul %28, %17 : !fuse.row<f32>
    %30 = fuse.add %29, %27 : !fuse.row<f32>
    %31 = fuse.select %6, %30, %0 : !fuse.row<f32>
    %32 = fuse.broadcast %lse_square_scale : !fuse.scalar<f32> to !fuse.row<f32>
    %33 = fuse.mul %32, %13 : !fuse.row<f32>
    %34 = fuse.mul %33, %13 : !fuse.row<f32>
    %35 = fuse.select %6, %34, %0 : !fuse.row<f32>
    fuse.yield %31, %35, %7, %12 : !fuse.row<f32>, !fuse.row<f32>, !fuse.row<f32>, !fuse.row<f32>
  }
}
