// RUN: grep -v -e '^ *//' -e '^$' %s > %t.expected
// RUN: tilefuse-opt %s | grep -v '^$' > %t.printed
// RUN: diff -u %t.expected %t.printed
// RUN: tilefuse-opt %s | tilefuse-opt | grep -v '^$' | diff -u %t.expected -
// RUN: tilefuse-opt %s -canonicalize -fuse-hoist-broadcasts | grep -v '^$' | diff -u %t.expected -
//
// Forward and backward in one kernel, for upstream gradients known in the
// forward (the in-place gradient and the fused linear cross-entropy write
// dlogits over the logits): loss and z_loss as the forward pass computes them,
// and dlogits as the backward pass does, from this pass's own lse and mass.
//
// Forward:
// Cross-entropy forward over class indices, per row (torch.nn.functional.
// cross_entropy with reduction='none', class weights w, ignore_index and label
// smoothing eps over n classes), plus the z-loss. With m = max(z),
// s = z - m, logS = log(sum(exp(s))) and lse = m + logS:
//   nll    = w[target] * (logS - (z[target] - m))
//   smooth = sum(w) * logS - sum(w * s)          (-sum_c w_c log_softmax(z)_c)
//   loss   = (1 - eps) * nll + (eps != 0 ? eps / n * smooth : 0)
//   z_loss = lse_square_scale * lse^2
// both 0 where target == ignore_index. As in torch, the smoothing term is
// left out when eps is 0 (a -inf logit makes it inf). w[target]
// (target_weight, 0 where ignored) comes from the host; lse and
// mass = (1 - eps) * w[target] + eps / n * sum(w) are saved for the backward
// pass. An ignored row gathers column 0, so no index ever leaves [0, n).
//
// Backward:
// Cross-entropy backward over class indices, from the forward's lse and mass
// and the upstream gradients of each row's loss (dloss) and z-loss (dz_loss),
// both taken as 0 where target == ignore_index:
//   p = exp(z - lse)
//   dz = p * (dloss * mass + 2 * lse_square_scale * dz_loss * lse)
//        - dloss * ((1 - eps) * w[target] * onehot(target) + eps / n * w)
//
// Here z = softcap * tanh(logits / softcap) (Gemma 2's soft-capping), and the
// gradient with respect to the logits is dz * (1 - tanh(logits / softcap)^2).
module {
  fuse.kernel @cross_entropy_capped_fwd_grad(%logits: !fuse.full<f32>, %target: !fuse.row<i64>, %weight: !fuse.col<f32>, %target_weight: !fuse.row<f32>, %dloss: !fuse.row<f32>, %dz_loss: !fuse.row<f32>, %ignore_index: !fuse.scalar<i64>, %label_smoothing: !fuse.scalar<f32>, %lse_square_scale: !fuse.scalar<f32>, %softcap: !fuse.scalar<f32>) -> (loss: !fuse.row<f32>, z_loss: !fuse.row<f32>, dlogits: !fuse.full<f32>) {
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
    %30 = fuse.mul %target_weight, %29 : !fuse.row<f32>
    %31 = fuse.broadcast %weight : !fuse.col<f32> to !fuse.full<f32>
    %32 = fuse.reduce sum %31 : !fuse.full<f32> to !fuse.row<f32>
    %33 = fuse.mul %31, %9 : !fuse.full<f32>
    %34 = fuse.reduce sum %33 : !fuse.full<f32> to !fuse.row<f32>
    %35 = fuse.mul %32, %21 : !fuse.row<f32>
    %36 = fuse.sub %35, %34 : !fuse.row<f32>
    %37 = fuse.broadcast %12 : !fuse.scalar<f32> to !fuse.row<f32>
    %38 = fuse.mul %37, %36 : !fuse.row<f32>
    %39 = fuse.cmp ne, %label_smoothing, %4 : !fuse.scalar<f32>
    %40 = fuse.broadcast %39 : !fuse.scalar<i1> to !fuse.row<i1>
    %41 = fuse.select %40, %38, %1 : !fuse.row<f32>
    %42 = fuse.broadcast %10 : !fuse.scalar<f32> to !fuse.row<f32>
    %43 = fuse.mul %42, %30 : !fuse.row<f32>
    %44 = fuse.add %43, %41 : !fuse.row<f32>
    %45 = fuse.select %14, %44, %1 : !fuse.row<f32>
    %46 = fuse.mul %37, %32 : !fuse.row<f32>
    %47 = fuse.mul %42, %target_weight : !fuse.row<f32>
    %48 = fuse.add %47, %46 : !fuse.row<f32>
    %49 = fuse.broadcast %lse_square_scale : !fuse.scalar<f32> to !fuse.row<f32>
    %50 = fuse.mul %49, %21 : !fuse.row<f32>
    %51 = fuse.mul %50, %21 : !fuse.row<f32>
    %52 = fuse.select %14, %51, %1 : !fuse.row<f32>
    %53 = fuse.broadcast %20 : !fuse.row<f32> to !fuse.full<f32>
    %54 = fuse.sub %17, %53 : !fuse.full<f32>
    %55 = fuse.exp %54 : !fuse.full<f32>
    %56 = fuse.iota : !fuse.col<i64>
    %57 = fuse.broadcast %56 : !fuse.col<i64> to !fuse.full<i64>
    %58 = fuse.broadcast %target : !fuse.row<i64> to !fuse.full<i64>
    %59 = fuse.cmp eq, %57, %58 : !fuse.full<i64>
    %60 = fuse.cast %59 : !fuse.full<i1> to !fuse.full<f32>
    %61 = fuse.broadcast %12 : !fuse.scalar<f32> to !fuse.col<f32>
    %62 = fuse.mul %61, %weight : !fuse.col<f32>
    %63 = fuse.broadcast %47 : !fuse.row<f32> to !fuse.full<f32>
    %64 = fuse.mul %63, %60 : !fuse.full<f32>
    %65 = fuse.broadcast %62 : !fuse.col<f32> to !fuse.full<f32>
    %66 = fuse.add %64, %65 : !fuse.full<f32>
    %67 = fuse.select %14, %dloss, %1 : !fuse.row<f32>
    %68 = fuse.select %14, %dz_loss, %1 : !fuse.row<f32>
    %69 = fuse.mul %lse_square_scale, %3 : !fuse.scalar<f32>
    %70 = fuse.broadcast %69 : !fuse.scalar<f32> to !fuse.row<f32>
    %71 = fuse.mul %70, %68 : !fuse.row<f32>
    %72 = fuse.mul %71, %21 : !fuse.row<f32>
    %73 = fuse.mul %67, %48 : !fuse.row<f32>
    %74 = fuse.add %73, %72 : !fuse.row<f32>
    %75 = fuse.broadcast %67 : !fuse.row<f32> to !fuse.full<f32>
    %76 = fuse.mul %75, %66 : !fuse.full<f32>
    %77 = fuse.broadcast %74 : !fuse.row<f32> to !fuse.full<f32>
    %78 = fuse.mul %55, %77 : !fuse.full<f32>
    %79 = fuse.sub %78, %76 : !fuse.full<f32>
    %80 = fuse.div %9, %6 : !fuse.full<f32>
    %81 = fuse.mul %80, %80 : !fuse.full<f32>
    %82 = fuse.sub %0, %81 : !fuse.full<f32>
    %83 = fuse.mul %79, %82 : !fuse.full<f32>
    fuse.yield %45, %52, %83 : !fuse.row<f32>, !fuse.row<f32>, !fuse.full<f32>
  }
}
