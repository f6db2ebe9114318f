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
//   loss   = (1 - eps) * nll + (eps != 0 ? eps * (lse - mean(z)) : 0)
//   z_loss = lse_square_scale * lse^2
// both 0 where target == ignore_index. As in torch, the smoothing term is
// left out when eps is 0 (a -inf logit makes it inf). lse is saved for the
// backward pass. An ignored row gathers column 0, so no index ever leaves
// [0, n).
//
// Here z = softcap * tanh(logits / softcap) (Gemma 2's soft-capping), and the
// gradient with respect to the logits is dz * (1 - tanh(logits / softcap)^2).
module {
  fuse.kernel @cross_entropy_capped_fwd(%logits: !fuse.full<f32>, %target: !fuse.row<i64>, %ignore_index: !fuse.scalar<i64>, %label_smoothing: !fuse.scalar<f32>, %lse_square_scale: !fuse.scalar<f32>, %softcap: !fuse.scalar<f32>) -> (loss: !fuse.row<f32>, z_loss: !fuse.row<f32>, lse: !fuse.row<f32>) {
    %0 = fuse.constant row 0.000000e+00 : f32
    %1 = fuse.constant row 0 : i64
    %2 = fuse.constant scalar 0.000000e+00 : f32
    %3 = fuse.constant scalar 1.000000e+00 : f32
    %4 = fuse.broadcast %softcap : !fuse.scalar<f32> to !fuse.full<f32>
    %5 = fuse.div %logits, %4 : !fuse.full<f32>
    %6 = fuse.tanh %5 : !fuse.full<f32>
    %7 = fuse.mul %4, %6 : !fuse.full<f32>
    %8 = fuse.sub %3, %label_smoothing : !fuse.scalar<f32>
    %9 = fuse.broadcast %ignore_index : !fuse.scalar<i64> to !fuse.row<i64>
    %10 = fuse.cmp ne, %target, %9 : !fuse.row<i64>
    %11 = fuse.reduce max %7 : !fuse.full<f32> to !fuse.row<f32>
    %12 = fuse.broadcast %11 : !fuse.row<f32> to !fuse.full<f32>
    %13 = fuse.sub %7, %12 : !fuse.full<f32>
    %14 = fuse.exp %13 : !fuse.full<f32>
    %15 = fuse.reduce sum %14 : !fuse.full<f32> to !fuse.row<f32>
    %16 = fuse.log %15 : !fuse.row<f32>
    %17 = fuse.add %11, %16 : !fuse.row<f32>
    %18 = fuse.select %10, %target, %1 : !fuse.row<i64>
    %19 = fuse.gather %logits[%18] : !fuse.full<f32>, !fuse.row<i64> -> !fuse.row<f32>
    %20 = fuse.broadcast %softcap : !fuse.scalar<f32> to !fuse.row<f32>
    %21 = fuse.div %19, %20 : !fuse.row<f32>
    %22 = fuse.tanh %21 : !fuse.row<f32>
    %23 = fuse.mul %20, %22 : !fuse.row<f32>
    %24 = fuse.sub %23, %11 : !fuse.row<f32>
    %25 = fuse.sub %16, %24 : !fuse.row<f32>
    %26 = fuse.reduce mean %7 : !fuse.full<f32> to !fuse.row<f32>
    %27 = fuse.sub %17, %26 : !fuse.row<f32>
    %28 = fuse.broadcast %label_smoothing : !fuse.scalar<f32> to !fuse.row<f32>
    %29 = fuse.mul %28, %27 : !fuse.row<f32>
    %30 = fuse.cmp ne, %label_smoothing, %2 : !fuse.scalar<f32>
    %31 = fuse.broadcast %30 : !fuse.scalar<i1> to !fuse.row<i1>
    %32 = fuse.select %31, %29, %0 : !fuse.row<f32>
    %33 = fuse.broadcast %8 : !fuse.scalar<f32> to !fuse.row<f32>
    %34 = fuse.mul %33, %25 : !fuse.row<f32>
    %35 = fuse.add %34, %32 : !fuse.row<f32>
    %36 = fuse.select %10, %35, %0 : !fuse.row<f32>
    %37 = fuse.broadcast %lse_square_scale : !fuse.scalar<f32> to !fuse.row<f32>
    %38 = fuse.mul %37, %17 : !fuse.row<f32>
    %39 = fuse.mul %38, %17 : !fuse.row<f32>
    %40 = fuse.select %10, %39, %0 : !fuse.row<f32>
    fuse.yield %36, %40, %17 : !fuse.row<f32>, !fuse.row<f32>, !fuse.row<f32>
  }
}
