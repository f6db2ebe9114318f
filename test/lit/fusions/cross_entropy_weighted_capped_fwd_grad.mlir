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
// Cross-entropy forward over class indices with class weights w, per row
// (torch.nn.functional.cross_entropy with reduction='none', ignore_index and
// label smoothing eps over n classes), plus the z-loss. With m = max(z),
// logS = log(sum(exp(z - m))) and lse = m + logS:
//   nll    = w[target] * (logS - (z[target] - m))
//   smooth = (sum(w) * lse - sum(w * z)) / n     (-sum_c w_c log_softmax(z)_c / n)
//   loss   = (1 - eps) * nll + (eps != 0 ? eps * smooth : 0)
//   z_loss = lse_square_scale * lse^2
// both 0 where target == ignore_index. As in torch, the smoothing term is
// left out when eps is 0 (a -inf logit makes it inf). w[target]
// (target_weight, 0 where ignored) comes from the host; lse and
// mass = (1 - eps) * w[target] + eps / n * sum(w) are saved for the backward
// pass. An ignored row gathers column 0, so no index ever leaves [0, n).
//
// Backward:
// Cross-entropy backward over class indices with class weights w, from the
// forward's lse and mass
// and the upstream gradients of each row's loss (dloss) and z-loss (dz_loss),
// both taken as 0 where target == ignore_index:
//   p = exp(z - lse)
//   dz = p * (dloss * mass + 2 * lse_square_scale * dz_loss * lse)
//        - dloss * ((1 - eps) * w[target] * onehot(target) + eps / n * w)
//
// Here z = softcap * tanh(logits / softcap) (Gemma 2's soft-capping), and the
// gradient with respect to the logits is dz * (1 - tanh(logits / softcap)^2).
module {
  fuse.kernel @cross_entropy_weighted_capped_fwd_grad(%logits: !fuse.full<f32>, %target: !fuse.row<i64>, %weight: !fuse.col<f32>, %target_weight: !fuse.row<f32>, %dloss: !fuse.row<f32>, %dz_loss: !fuse.row<f32>, %ignore_index: !fuse.scalar<i64>, %label_smoothing: !fuse.scalar<f32>, %lse_square_scale: !fuse.scalar<f32>, %softcap: !fuse.scalar<f32>) -> (loss: !fuse.row<f32>, z_loss: !fuse.row<f32>, dlogits: !fuse.full<f32>) {
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
    %30 = fuse.broadcast %weight : !fuse.col<f32> to !fuse.full<f32>
    %31 = fuse.reduce sum %30 : !fuse.full<f32> to !fuse.row<f32>
    %32 = fuse.mul %30, %9 : !fuse.full<f32>
    %33 = fuse.reduce sum %32 : !fuse.full<f32> to !fuse.row<f32>
    %34 = fuse.mul %31, %21 : !fuse.row<f32>
    %35 = fuse.sub %34, %33 : !fuse.row<f32>
    %36 = fuse.broadcast %11 : !fuse.scalar<f32> to !fuse.row<f32>
    %37 = fuse.div %35, %36 : !fuse.row<f32>
    %38 = fuse.mul %target_weight, %29 : !fuse.row<f32>
    %39 = fuse.broadcast %12 : !fuse.scalar<f32> to !fuse.row<f32>
    %40 = fuse.mul %39, %31 : !fuse.row<f32>
    %41 = fuse.broadcast %10 : !fuse.scalar<f32> to !fuse.row<f32>
    %42 = fuse.mul %41, %target_weight : !fuse.row<f32>
    %43 = fuse.add %42, %40 : !fuse.row<f32>
    %44 = fuse.broadcast %label_smoothing : !fuse.scalar<f32> to !fuse.row<f32>
    %45 = fuse.mul %44, %37 : !fuse.row<f32>
    %46 = fuse.cmp ne, %label_smoothing, %4 : !fuse.scalar<f32>
    %47 = fuse.broadcast %46 : !fuse.scalar<i1> to !fuse.row<i1>
    %48 = fuse.select %47, %45, %1 : !fuse.row<f32>
    %49 = fuse.mul %41, %38 : !fuse.row<f32>
    %50 = fuse.add %49, %48 : !fuse.row<f32>
    %51 = fuse.select %14, %50, %1 : !fuse.row<f32>
    %52 = fuse.broadcast %lse_square_scale : !fuse.scalar<f32> to !fuse.row<f32>
    %53 = fuse.mul %52, %21 : !fuse.row<f32>
    %54 = fuse.mul %53, %21 : !fuse.row<f32>
    %55 = fuse.select %14, %54, %1 : !fuse.row<f32>
    %56 = fuse.broadcast %20 : !fuse.row<f32> to !fuse.full<f32>
    %57 = fuse.sub %17, %56 : !fuse.full<f32>
    %58 = fuse.exp %57 : !fuse.full<f32>
    %59 = fuse.iota : !fuse.col<i64>
    %60 = fuse.broadcast %59 : !fuse.col<i64> to !fuse.full<i64>
    %61 = fuse.broadcast %target : !fuse.row<i64> to !fuse.full<i64>
    %62 = fuse.cmp eq, %60, %61 : !fuse.full<i64>
    %63 = fuse.cast %62 : !fuse.full<i1> to !fuse.full<f32>
    %64 = fuse.broadcast %12 : !fuse.scalar<f32> to !fuse.col<f32>
    %65 = fuse.mul %64, %weight : !fuse.col<f32>
    %66 = fuse.broadcast %42 : !fuse.row<f32> to !fuse.full<f32>
    %67 = fuse.mul %66, %63 : !fuse.full<f32>
    %68 = fuse.broadcast %65 : !fuse.col<f32> to !fuse.full<f32>
    %69 = fuse.add %67, %68 : !fuse.full<f32>
    %70 = fuse.select %14, %dloss, %1 : !fuse.row<f32>
    %71 = fuse.select %14, %dz_loss, %1 : !fuse.row<f32>
    %72 = fuse.mul %lse_square_scale, %3 : !fuse.scalar<f32>
    %73 = fuse.broadcast %72 : !fuse.scalar<f32> to !fuse.row<f32>
    %74 = fuse.mul %73, %71 : !fuse.row<f32>
    %75 = fuse.mul %74, %21 : !fuse.row<f32>
    %76 = fuse.mul %70, %43 : !fuse.row<f32>
    %77 = fuse.add %76, %75 : !fuse.row<f32>
    %78 = fuse.broadcast %70 : !fuse.row<f32> to !fuse.full<f32>
    %79 = fuse.mul %78, %69 : !fuse.full<f32>
    %80 = fuse.broadcast %77 : !fuse.row<f32> to !fuse.full<f32>
    %81 = fuse.mul %58, %80 : !fuse.full<f32>
    %82 = fuse.sub %81, %79 : !fuse.full<f32>
    %83 = fuse.div %9, %6 : !fuse.full<f32>
    %84 = fuse.mul %83, %83 : !fuse.full<f32>
    %85 = fuse.sub %0, %84 : !fuse.full<f32>
    %86 = fuse.mul %82, %85 : !fuse.full<f32>
    fuse.yield %51, %55, %86 : !fuse.row<f32>, !fuse.row<f32>, !fuse.full<f32>
  }
}
