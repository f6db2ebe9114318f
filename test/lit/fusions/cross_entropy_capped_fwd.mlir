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
// logits / softcap is logits times softcap_reciprocal (1 / softcap, from the
// host).
module {
  fuse.kernel @cross_entropy_capped_fwd(%logits: !fuse.full<f32>, %target: !fuse.row<i64>, %ignore_index: !fuse.scalar<i64>, %label_smoothing: !fuse.scalar<f32>, %lse_square_scale: !fuse.scalar<f32>, %softcap: !fuse.scalar<f32>, %softcap_reciprocal: !fuse.scalar<f32>) -> (loss: !fuse.row<f32>, z_loss: !fuse.row<f32>, lse: !fuse.row<f32>) {
    %0 = fuse.constant scalar 0.000000e+00 : f32
    %1 = fuse.constant row 0 : i64
    %2 = fuse.constant row 0.000000e+00 : f32
    %3 = fuse.constant scalar 1.000000e+00 : f32
    %4 = fuse.broadcast %softcap_reciprocal : !fuse.scalar<f32> to !fuse.full<f32>
    %5 = fuse.broadcast %softcap_reciprocal : !fuse.scalar<f32> to !fuse.row<f32>
    %6 = fuse.broadcast %softcap : !fuse.scalar<f32> to !fuse.full<f32>
    %7 = fuse.mul %logits, %4 : !fuse.full<f32>
    %8 = fuse.tanh %7 : !fuse.full<f32>
    %9 = fuse.mul %6, %8 : !fuse.full<f32>
    %10 = fuse.sub %3, %label_smoothing : !fuse.scalar<f32>
    %11 = fuse.broadcast %ignore_index : !fuse.scalar<i64> to !fuse.row<i64>
    %12 = fuse.cmp ne, %target, %11 : !fuse.row<i64>
    %13 = fuse.reduce max %9 : !fuse.full<f32> to !fuse.row<f32>
    %14 = fuse.broadcast %13 : !fuse.row<f32> to !fuse.full<f32>
    %15 = fuse.sub %9, %14 : !fuse.full<f32>
    %16 = fuse.exp %15 : !fuse.full<f32>
    %17 = fuse.reduce sum %16 : !fuse.full<f32> to !fuse.row<f32>
    %18 = fuse.log %17 : !fuse.row<f32>
    %19 = fuse.add %13, %18 : !fuse.row<f32>
    %20 = fuse.select %12, %target, %1 : !fuse.row<i64>
    %21 = fuse.gather %logits[%20] : !fuse.full<f32>, !fuse.row<i64> -> !fuse.row<f32>
    %22 = fuse.broadcast %softcap : !fuse.scalar<f32> to !fuse.row<f32>
    %23 = fuse.mul %21, %5 : !fuse.row<f32>
    %24 = fuse.tanh %23 : !fuse.row<f32>
    %25 = fuse.mul %22, %24 : !fuse.row<f32>
    %26 = fuse.sub %25, %13 : !fuse.row<f32>
    %27 = fuse.sub %18, %26 : !fuse.row<f32>
    %28 = fuse.reduce mean %9 : !fuse.full<f32> to !fuse.row<f32>
    %29 = fuse.sub %19, %28 : !fuse.row<f32>
    %30 = fuse.broadcast %label_smoothing : !fuse.scalar<f32> to !fuse.row<f32>
    %31 = fuse.mul %30, %29 : !fuse.row<f32>
    %32 = fuse.cmp ne, %label_smoothing, %0 : !fuse.scalar<f32>
    %33 = fuse.broadcast %32 : !fuse.scalar<i1> to !fuse.row<i1>
    %34 = fuse.select %33, %31, %2 : !fuse.row<f32>
    %35 = fuse.broadcast %10 : !fuse.scalar<f32> to !fuse.row<f32>
    %36 = fuse.mul %35, %27 : !fuse.row<f32>
    %37 = fuse.add %36, %34 : !fuse.row<f32>
    %38 = fuse.select %12, %37, %2 : !fuse.row<f32>
    %39 = fuse.broadcast %lse_square_scale : !fuse.scalar<f32> to !fuse.row<f32>
    %40 = fuse.mul %39, %19 : !fuse.row<f32>
    %41 = fuse.mul %40, %19 : !fuse.row<f32>
    %42 = fuse.select %12, %41, %2 : !fuse.row<f32>
    fuse.yield %38, %42, %19 : !fuse.row<f32>, !fuse.row<f32>, !fuse.row<f32>
  }
}
