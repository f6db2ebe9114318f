// RUN: grep -v -e '^ *//' -e '^$' %s > %t.expected
// RUN: tilefuse-opt %s | grep -v '^$' > %t.printed
// RUN: diff -u %t.expected %t.printed
// RUN: tilefuse-opt %s | tilefuse-opt | grep -v '^$' | diff -u %t.expected -
// RUN: tilefuse-opt %s -canonicalize -fuse-hoist-broadcasts | grep -v '^$' | diff -u %t.expected -
//
// Forward and backward in one kernel, for upstream gradients known in the
// forward (the in-place gradient and the fused linear cross-entropy write
// dlogits over the logits): loss and z_loss as the forward pass computes them,
// and dlogits as the backward pass does, from this pass's own statistics.
//
// Forward:
// Cross-entropy forward over class indices, per row (torch.nn.functional.
// cross_entropy with reduction='none', ignore_index and label smoothing eps),
// plus the z-loss. With m = max(z), logS = log(sum(exp(z - m))) and
// lse = m + logS:
//   nll    = logS - (z[target] - m)
//   loss   = (1 - eps) * nll + (eps != 0 ? eps * (logS - sum(z - m) / n) : 0)
//   z_loss = lse_square_scale * lse^2
// both 0 where target == ignore_index. As in torch, the smoothing term is
// left out when eps is 0 (a -inf logit makes it inf). An ignored row
// gathers column 0, so no index ever leaves [0, n).
// The smoothing sums are about m, as torch's log_softmax takes them (sum(z)
// overflows in rows of huge logits); fuse-merge-reductions puts them in
// m's pass.
//
// Backward:
// Cross-entropy backward over class indices, from this pass's m = max(z)
// and logS = log(sum(exp(z - m))), and the upstream gradients of each row's
// loss (dloss) and z-loss (dz_loss), both taken as 0 where
// target == ignore_index, over n classes:
//   p = exp((z - m) - logS), lse = m + logS
//   dz = p * (dloss + 2 * lse_square_scale * dz_loss * lse)
//        - dloss * ((1 - eps) * onehot(target) + eps / n)
//
// Here z is the logits themselves.
module {
  fuse.kernel @cross_entropy_fwd_grad(%logits: !fuse.full<f32>, %target: !fuse.row<i64>, %dloss: !fuse.row<f32>, %dz_loss: !fuse.row<f32>, %ignore_index: !fuse.scalar<i64>, %label_smoothing: !fuse.scalar<f32>, %lse_square_scale: !fuse.scalar<f32>) -> (loss: !fuse.row<f32>, z_loss: !fuse.row<f32>, dlogits: !fuse.full<f32>) {
    %0 = fuse.constant row 0.000000e+00 : f32
    %1 = fuse.constant row 0 : i64
    %2 = fuse.constant scalar 2.000000e+00 : f32
    %3 = fuse.constant scalar 0.000000e+00 : f32
    %4 = fuse.constant scalar 1.000000e+00 : f32
    %5 = fuse.sub %4, %label_smoothing : !fuse.scalar<f32>
    %6 = fuse.row_length : !fuse.scalar<f32>
    %7 = fuse.div %label_smoothing, %6 : !fuse.scalar<f32>
    %8 = fuse.broadcast %ignore_index : !fuse.scalar<i64> to !fuse.row<i64>
    %9 = fuse.cmp ne, %target, %8 : !fuse.row<i64>
    %10 = fuse.reduce max %logits : !fuse.full<f32> to !fuse.row<f32>
    %11 = fuse.broadcast %10 : !fuse.row<f32> to !fuse.full<f32>
    %12 = fuse.sub %logits, %11 : !fuse.full<f32>
    %13 = fuse.exp %12 : !fuse.full<f32>
    %14 = fuse.reduce sum %13 : !fuse.full<f32> to !fuse.row<f32>
    %15 = fuse.log %14 : !fuse.row<f32>
    %16 = fuse.add %10, %15 : !fuse.row<f32>
    %17 = fuse.select %9, %target, %1 : !fuse.row<i64>
    %18 = fuse.gather %logits[%17] : !fuse.full<f32>, !fuse.row<i64> -> !fuse.row<f32>
    %19 = fuse.sub %18, %10 : !fuse.row<f32>
    %20 = fuse.sub %15, %19 : !fuse.row<f32>
    %21 = fuse.row_length : !fuse.scalar<f32>
    %22 = fuse.reduce sum %12 : !fuse.full<f32> to !fuse.row<f32>
    %23 = fuse.broadcast %21 : !fuse.scalar<f32> to !fuse.row<f32>
    %24 = fuse.div %22, %23 : !fuse.row<f32>
    %25 = fuse.sub %15, %24 : !fuse.row<f32>
    %26 = fuse.broadcast %label_smoothing : !fuse.scalar<f32> to !fuse.row<f32>
    %27 = fuse.mul %26, %25 : !fuse.row<f32>
    %28 = fuse.cmp ne, %label_smoothing, %3 : !fuse.scalar<f32>
    %29 = fuse.broadcast %28 : !fuse.scalar<i1> to !fuse.row<i1>
    %30 = fuse.select %29, %27, %0 : !fuse.row<f32>
    %31 = fuse.broadcast %5 : !fuse.scalar<f32> to !fuse.row<f32>
    %32 = fuse.mul %31, %20 : !fuse.row<f32>
    %33 = fuse.add %32, %30 : !fuse.row<f32>
    %34 = fuse.select %9, %33, %0 : !fuse.row<f32>
    %35 = fuse.broadcast %lse_square_scale : !fuse.scalar<f32> to !fuse.row<f32>
    %36 = fuse.mul %35, %16 : !fuse.row<f32>
    %37 = fuse.mul %36, %16 : !fuse.row<f32>
    %38 = fuse.select %9, %37, %0 : !fuse.row<f32>
    %39 = fuse.broadcast %15 : !fuse.row<f32> to !fuse.full<f32>
    %40 = fuse.sub %12, %39 : !fuse.full<f32>
    %41 = fuse.exp %40 : !fuse.full<f32>
    %42 = fuse.iota : !fuse.col<i64>
    %43 = fuse.broadcast %42 : !fuse.col<i64> to !fuse.full<i64>
    %44 = fuse.broadcast %target : !fuse.row<i64> to !fuse.full<i64>
    %45 = fuse.cmp eq, %43, %44 : !fuse.full<i64>
    %46 = fuse.cast %45 : !fuse.full<i1> to !fuse.full<f32>
    %47 = fuse.broadcast %5 : !fuse.scalar<f32> to !fuse.full<f32>
    %48 = fuse.mul %47, %46 : !fuse.full<f32>
    %49 = fuse.broadcast %7 : !fuse.scalar<f32> to !fuse.full<f32>
    %50 = fuse.add %48, %49 : !fuse.full<f32>
    %51 = fuse.select %9, %dloss, %0 : !fuse.row<f32>
    %52 = fuse.select %9, %dz_loss, %0 : !fuse.row<f32>
    %53 = fuse.mul %lse_square_scale, %2 : !fuse.scalar<f32>
    %54 = fuse.broadcast %53 : !fuse.scalar<f32> to !fuse.row<f32>
    %55 = fuse.mul %54, %52 : !fuse.row<f32>
    %56 = fuse.mul %55, %16 : !fuse.row<f32>
    %57 = fuse.add %51, %56 : !fuse.row<f32>
    %58 = fuse.broadcast %51 : !fuse.row<f32> to !fuse.full<f32>
    %59 = fuse.mul %58, %50 : !fuse.full<f32>
    %60 = fuse.broadcast %57 : !fuse.row<f32> to !fuse.full<f32>
    %61 = fuse.mul %41, %60 : !fuse.full<f32>
    %62 = fuse.sub %61, %59 : !fuse.full<f32>
    fuse.yield %34, %38, %62 : !fuse.row<f32>, !fuse.row<f32>, !fuse.full<f32>
  }
}
