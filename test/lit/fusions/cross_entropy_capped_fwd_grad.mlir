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
//   loss   = (1 - eps) * nll + (eps != 0 ? eps * (lse - mean(z)) : 0)
//   z_loss = lse_square_scale * lse^2
// both 0 where target == ignore_index. As in torch, the smoothing term is
// left out when eps is 0 (a -inf logit makes it inf). lse is saved for the
// backward pass. An ignored row gathers column 0, so no index ever leaves
// [0, n).
//
// Backward:
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
  fuse.kernel @cross_entropy_capped_fwd_grad(%logits: !fuse.full<f32>, %target: !fuse.row<i64>, %dloss: !fuse.row<f32>, %dz_loss: !fuse.row<f32>, %ignore_index: !fuse.scalar<i64>, %label_smoothing: !fuse.scalar<f32>, %lse_square_scale: !fuse.scalar<f32>, %softcap: !fuse.scalar<f32>) -> (loss: !fuse.row<f32>, z_loss: !fuse.row<f32>, dlogits: !fuse.full<f32>) {
    %0 = fuse.constant full 1.000000e+00 : f32
    %1 = fuse.constant row 0.000000e+00 : f32
    %2 = fuse.constant row 0 : i64
    %3 = fuse.constant scalar 2.000000e+00 : f32
    %4 = fuse.constant scalar 0.000000e+00 : f32
    %5 = fuse.constant scalar 1.000000e+00 : f32
    %6 = fuse.broadcast %softcap : !fuse.scalar<f32> to !fuse.full<f32>
    %7 = fuse.div %logits, %6 : !fuse.full<f32>
    %8 = fuse.tanh %7 : !fuse.full<f32>
    %9 = fuse.mul %6, %8 : !fuse.full<f32>
    %10 = fuse.sub %5, %label_smoothing : !fuse.scalar<f32>
    %11 = fuse.row_length : !fuse.scalar<f32>
    %12 = fuse.div %label_smoothing, %11 : !fuse.scalar<f32>
    %13 = fuse.broadcast %ignore_index : !fuse.scalar<i64> to !fuse.row<i64>
    %14 = fuse.cmp ne, %target, %13 : !fuse.row<i64>
    %15 = fuse.reduce max %9 : !fuse.full<f32> to !fuse.row<f32>
    %16 = fuse.broadcast %15 : !fuse.row<f32> to !fuse.full<f32>
    %17 = fuse.sub %9, %16 : !fuse.full<f32>
    %18 = fuse.exp %17 : !fuse.full<f32>
    %19 = fuse.reduce sum %18 : !fuse.full<f32> to !fuse.row<f32>
    %20 = fuse.log %19 : !fuse.row<f32>
    %21 = fuse.add %15, %20 : !fuse.row<f32>
    %22 = fuse.select %14, %target, %2 : !fuse.row<i64>
    %23 = fuse.gather %logits[%22] : !fuse.full<f32>, !fuse.row<i64> -> !fuse.row<f32>
    %24 = fuse.broadcast %softcap : !fuse.scalar<f32> to !fuse.row<f32>
    %25 = fuse.div %23, %24 : !fuse.row<f32>
    %26 = fuse.tanh %25 : !fuse.row<f32>
    %27 = fuse.mul %24, %26 : !fuse.row<f32>
    %28 = fuse.sub %27, %15 : !fuse.row<f32>
    %29 = fuse.sub %20, %28 : !fuse.row<f32>
    %30 = fuse.reduce mean %9 : !fuse.full<f32> to !fuse.row<f32>
    %31 = fuse.sub %21, %30 : !fuse.row<f32>
    %32 = fuse.broadcast %label_smoothing : !fuse.scalar<f32> to !fuse.row<f32>
    %33 = fuse.mul %32, %31 : !fuse.row<f32>
    %34 = fuse.cmp ne, %label_smoothing, %4 : !fuse.scalar<f32>
    %35 = fuse.broadcast %34 : !fuse.scalar<i1> to !fuse.row<i1>
    %36 = fuse.select %35, %33, %1 : !fuse.row<f32>
    %37 = fuse.broadcast %10 : !fuse.scalar<f32> to !fuse.row<f32>
    %38 = fuse.mul %37, %29 : !fuse.row<f32>
    %39 = fuse.add %38, %36 : !fuse.row<f32>
    %40 = fuse.select %14, %39, %1 : !fuse.row<f32>
    %41 = fuse.broadcast %lse_square_scale : !fuse.scalar<f32> to !fuse.row<f32>
    %42 = fuse.mul %41, %21 : !fuse.row<f32>
    %43 = fuse.mul %42, %21 : !fuse.row<f32>
    %44 = fuse.select %14, %43, %1 : !fuse.row<f32>
    %45 = fuse.broadcast %20 : !fuse.row<f32> to !fuse.full<f32>
    %46 = fuse.sub %17, %45 : !fuse.full<f32>
    %47 = fuse.exp %46 : !fuse.full<f32>
    %48 = fuse.iota : !fuse.col<i64>
    %49 = fuse.broadcast %48 : !fuse.col<i64> to !fuse.full<i64>
    %50 = fuse.broadcast %target : !fuse.row<i64> to !fuse.full<i64>
    %51 = fuse.cmp eq, %49, %50 : !fuse.full<i64>
    %52 = fuse.cast %51 : !fuse.full<i1> to !fuse.full<f32>
    %53 = fuse.broadcast %10 : !fuse.scalar<f32> to !fuse.full<f32>
    %54 = fuse.mul %53, %52 : !fuse.full<f32>
    %55 = fuse.broadcast %12 : !fuse.scalar<f32> to !fuse.full<f32>
    %56 = fuse.add %54, %55 : !fuse.full<f32>
    %57 = fuse.select %14, %dloss, %1 : !fuse.row<f32>
    %58 = fuse.select %14, %dz_loss, %1 : !fuse.row<f32>
    %59 = fuse.mul %lse_square_scale, %3 : !fuse.scalar<f32>
    %60 = fuse.broadcast %59 : !fuse.scalar<f32> to !fuse.row<f32>
    %61 = fuse.mul %60, %58 : !fuse.row<f32>
    %62 = fuse.mul %61, %21 : !fuse.row<f32>
    %63 = fuse.add %57, %62 : !fuse.row<f32>
    %64 = fuse.broadcast %57 : !fuse.row<f32> to !fuse.full<f32>
    %65 = fuse.mul %64, %56 : !fuse.full<f32>
    %66 = fuse.broadcast %63 : !fuse.row<f32> to !fuse.full<f32>
    %67 = fuse.mul %47, %66 : !fuse.full<f32>
    %68 = fuse.sub %67, %65 : !fuse.full<f32>
    %69 = fuse.div %9, %6 : !fuse.full<f32>
    %70 = fuse.mul %69, %69 : !fuse.full<f32>
    %71 = fuse.sub %0, %70 : !fuse.full<f32>
    %72 = fuse.mul %68, %71 : !fuse.full<f32>
    fuse.yield %40, %44, %72 : !fuse.row<f32>, !fuse.row<f32>, !fuse.full<f32>
  }
}
