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
// Here z = softcap * tanh(logits / softcap) (Gemma 2's soft-capping), and the
// gradient with respect to the logits is dz * (1 - tanh(logits / softcap)^2).
// logits / softcap is logits times softcap_reciprocal (1 / softcap, from the
// host).
module {
  fuse.kernel @cross_entropy_capped_fwd(%logits: !fuse.full<f32>, %target: !fuse.row<i64>, %ignore_index: !fuse.scalar<i64>, %label_smoothing: !fuse.scalar<f32>, %lse_square_scale: !fuse.scalar<f32>, %softcap: !fuse.scalar<f32>, %softcap_reciprocal: !fuse.scalar<f32>) -> (loss: !fuse.row<f32>, z_loss: !fuse.row<f32>, max: !fuse.row<f32>, log_sum: !fuse.row<f32>) {
    %0 = fuse.constant row 0.000000e+00 : f32
    %1 = fuse.constant row 0 : i64
    %2 = fuse.constant scalar 0.000000e+00 : f32
    %3 = fuse.constant scalar 1.000000e+00 : f32
    %4 = fuse.broadcast %softcap_reciprocal : !fuse.scalar<f32> to !fuse.full<f32>
    %5 = fuse.mul %logits, %4 : !fuse.full<f32>
    %6 = fuse.tanh %5 : !fuse.full<f32>
    %7 = fuse.broadcast %softcap : !fuse.scalar<f32> to !fuse.full<f32>
    %8 = fuse.mul %7, %6 : !fuse.full<f32>
    %9 = fuse.sub %3, %label_smoothing : !fuse.scalar<f32>
    %10 = fuse.broadcast %ignore_index : !fuse.scalar<i64> to !fuse.row<i64>
    %11 = fuse.cmp ne, %target, %10 : !fuse.row<i64>
    %12 = fuse.reduce max %8 : !fuse.full<f32> to !fuse.row<f32>
    %13 = fuse.broadcast %12 : !fuse.row<f32> to !fuse.full<f32>
    %14 = fuse.sub %8, %13 : !fuse.full<f32>
    %15 = fuse.exp %14 : !fuse.full<f32>
    %16 = fuse.reduce sum %15 : !fuse.full<f32> to !fuse.row<f32>
    %17 = fuse.log %16 : !fuse.row<f32>
    %18 = fuse.add %12, %17 : !fuse.row<f32>
    %19 = fuse.select %11, %target, %1 : !fuse.row<i64>
    %20 = fuse.gather %logits[%19] : !fuse.full<f32>, !fuse.row<i64> -> !fuse.row<f32>
    %21 = fuse.broadcast %softcap_reciprocal : !fuse.scalar<f32> to !fuse.row<f32>
    %22 = fuse.mul %20, %21 : !fuse.row<f32>
    %23 = fuse.tanh %22 : !fuse.row<f32>
    %24 = fuse.broadcast %softcap : !fuse.scalar<f32> to !fuse.row<f32>
    %25 = fuse.mul %24, %23 : !fuse.row<f32>
    %26 = fuse.sub %25, %12 : !fuse.row<f32>
    %27 = fuse.sub %17, %26 : !fuse.row<f32>
    %28 = fuse.row_length : !fuse.scalar<f32>
    %29 = fuse.reduce sum %14 : !fuse.full<f32> to !fuse.row<f32>
    %30 = fuse.broadcast %28 : !fuse.scalar<f32> to !fuse.row<f32>
    %31 = fuse.div %29, %30 : !fuse.row<f32>
    %32 = fuse.sub %17, %31 : !fuse.row<f32>
    %33 = fuse.broadcast %label_smoothing : !fuse.scalar<f32> to !fuse.row<f32>
    %34 = fuse.mul %33, %32 : !fuse.row<f32>
    %35 = fuse.cmp ne, %label_smoothing, %2 : !fuse.scalar<f32>
    %36 = fuse.broadcast %35 : !fuse.scalar<i1> to !fuse.row<i1>
    %37 = fuse.select %36, %34, %0 : !fuse.row<f32>
    %38 = fuse.broadcast %9 : !fuse.scalar<f32> to !fuse.row<f32>
    %39 = fuse.mul %38, %27 : !fuse.row<f32>
    %40 = fuse.add %39, %37 : !fuse.row<f32>
    %41 = fuse.select %11, %40, %0 : !fuse.row<f32>
    %42 = fuse.broadcast %lse_square_scale : !fuse.scalar<f32> to !fuse.row<f32>
    %43 = fuse.mul %42, %18 : !fuse.row<f32>
    %44 = fuse.mul %43, %18 : !fuse.row<f32>
    %45 = fuse.select %11, %44, %0 : !fuse.row<f32>
    fuse.yield %41, %45, %12, %17 : !fuse.row<f32>, !fuse.row<f32>, !fuse.row<f32>, !fuse.row<f32>
  }
}
