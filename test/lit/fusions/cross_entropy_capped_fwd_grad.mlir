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
// logits / softcap is logits times softcap_reciprocal (1 / softcap, from the
// host).
module {
  fuse.kernel @cross_entropy_capped_fwd_grad(%logits: !fuse.full<f32>, %target: !fuse.row<i64>, %dloss: !fuse.row<f32>, %dz_loss: !fuse.row<f32>, %ignore_index: !fuse.scalar<i64>, %label_smoothing: !fuse.scalar<f32>, %lse_square_scale: !fuse.scalar<f32>, %softcap: !fuse.scalar<f32>, %softcap_reciprocal: !fuse.scalar<f32>) -> (loss: !fuse.row<f32>, z_loss: !fuse.row<f32>, dlogits: !fuse.full<f32>) {
    %0 = fuse.constant scalar 0.000000e+00 : f32
    %1 = fuse.constant scalar 2.000000e+00 : f32
    %2 = fuse.constant row 0 : i64
    %3 = fuse.constant row 0.000000e+00 : f32
    %4 = fuse.constant full 1.000000e+00 : f32
    %5 = fuse.constant scalar 1.000000e+00 : f32
    %6 = fuse.broadcast %softcap_reciprocal : !fuse.scalar<f32> to !fuse.full<f32>
    %7 = fuse.broadcast %softcap_reciprocal : !fuse.scalar<f32> to !fuse.row<f32>
    %8 = fuse.broadcast %softcap : !fuse.scalar<f32> to !fuse.full<f32>
    %9 = fuse.mul %logits, %6 : !fuse.full<f32>
    %10 = fuse.tanh %9 : !fuse.full<f32>
    %11 = fuse.mul %8, %10 : !fuse.full<f32>
    %12 = fuse.sub %5, %label_smoothing : !fuse.scalar<f32>
    %13 = fuse.row_length : !fuse.scalar<f32>
    %14 = fuse.div %label_smoothing, %13 : !fuse.scalar<f32>
    %15 = fuse.broadcast %ignore_index : !fuse.scalar<i64> to !fuse.row<i64>
    %16 = fuse.cmp ne, %target, %15 : !fuse.row<i64>
    %17 = fuse.reduce max %11 : !fuse.full<f32> to !fuse.row<f32>
    %18 = fuse.broadcast %17 : !fuse.row<f32> to !fuse.full<f32>
    %19 = fuse.sub %11, %18 : !fuse.full<f32>
    %20 = fuse.exp %19 : !fuse.full<f32>
    %21 = fuse.reduce sum %20 : !fuse.full<f32> to !fuse.row<f32>
    %22 = fuse.log %21 : !fuse.row<f32>
    %23 = fuse.add %17, %22 : !fuse.row<f32>
    %24 = fuse.select %16, %target, %2 : !fuse.row<i64>
    %25 = fuse.gather %logits[%24] : !fuse.full<f32>, !fuse.row<i64> -> !fuse.row<f32>
    %26 = fuse.broadcast %softcap : !fuse.scalar<f32> to !fuse.row<f32>
    %27 = fuse.mul %25, %7 : !fuse.row<f32>
    %28 = fuse.tanh %27 : !fuse.row<f32>
    %29 = fuse.mul %26, %28 : !fuse.row<f32>
    %30 = fuse.sub %29, %17 : !fuse.row<f32>
    %31 = fuse.sub %22, %30 : !fuse.row<f32>
    %32 = fuse.reduce mean %11 : !fuse.full<f32> to !fuse.row<f32>
    %33 = fuse.sub %23, %32 : !fuse.row<f32>
    %34 = fuse.broadcast %label_smoothing : !fuse.scalar<f32> to !fuse.row<f32>
    %35 = fuse.mul %34, %33 : !fuse.row<f32>
    %36 = fuse.cmp ne, %label_smoothing, %0 : !fuse.scalar<f32>
    %37 = fuse.broadcast %36 : !fuse.scalar<i1> to !fuse.row<i1>
    %38 = fuse.select %37, %35, %3 : !fuse.row<f32>
    %39 = fuse.broadcast %12 : !fuse.scalar<f32> to !fuse.row<f32>
    %40 = fuse.mul %39, %31 : !fuse.row<f32>
    %41 = fuse.add %40, %38 : !fuse.row<f32>
    %42 = fuse.select %16, %41, %3 : !fuse.row<f32>
    %43 = fuse.broadcast %lse_square_scale : !fuse.scalar<f32> to !fuse.row<f32>
    %44 = fuse.mul %43, %23 : !fuse.row<f32>
    %45 = fuse.mul %44, %23 : !fuse.row<f32>
    %46 = fuse.select %16, %45, %3 : !fuse.row<f32>
    %47 = fuse.broadcast %22 : !fuse.row<f32> to !fuse.full<f32>
    %48 = fuse.sub %19, %47 : !fuse.full<f32>
    %49 = fuse.exp %48 : !fuse.full<f32>
    %50 = fuse.iota : !fuse.col<i64>
    %51 = fuse.broadcast %50 : !fuse.col<i64> to !fuse.full<i64>
    %52 = fuse.broadcast %target : !fuse.row<i64> to !fuse.full<i64>
    %53 = fuse.cmp eq, %51, %52 : !fuse.full<i64>
    %54 = fuse.cast %53 : !fuse.full<i1> to !fuse.full<f32>
    %55 = fuse.broadcast %12 : !fuse.scalar<f32> to !fuse.full<f32>
    %56 = fuse.mul %55, %54 : !fuse.full<f32>
    %57 = fuse.broadcast %14 : !fuse.scalar<f32> to !fuse.full<f32>
    %58 = fuse.add %56, %57 : !fuse.full<f32>
    %59 = fuse.select %16, %dloss, %3 : !fuse.row<f32>
    %60 = fuse.select %16, %dz_loss, %3 : !fuse.row<f32>
    %61 = fuse.mul %lse_square_scale, %1 : !fuse.scalar<f32>
    %62 = fuse.broadcast %61 : !fuse.scalar<f32> to !fuse.row<f32>
    %63 = fuse.mul %62, %60 : !fuse.row<f32>
    %64 = fuse.mul %63, %23 : !fuse.row<f32>
    %65 = fuse.add %59, %64 : !fuse.row<f32>
    %66 = fuse.broadcast %59 : !fuse.row<f32> to !fuse.full<f32>
    %67 = fuse.mul %66, %58 : !fuse.full<f32>
    %68 = fuse.broadcast %65 : !fuse.row<f32> to !fuse.full<f32>
    %69 = fuse.mul %49, %68 : !fuse.full<f32>
    %70 = fuse.sub %69, %67 : !fuse.full<f32>
    %71 = fuse.mul %11, %6 : !fuse.full<f32>
    %72 = fuse.mul %71, %71 : !fuse.full<f32>
    %73 = fuse.sub %4, %72 : !fuse.full<f32>
    %74 = fuse.mul %70, %73 : !fuse.full<f32>
    fuse.yield %42, %46, %74 : !fuse.row<f32>, !fuse.row<f32>, !fuse.full<f32>
  }
}
