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
//   smooth = (sum(w) * logS - sum(w * (z - m))) / n (-sum_c w_c log_softmax(z)_c / n)
//   loss   = (1 - eps) * nll + (eps != 0 ? eps * smooth : 0)
//   z_loss = lse_square_scale * lse^2
// both 0 where target == ignore_index. As in torch, the smoothing term is
// left out when eps is 0 (a -inf logit makes it inf). w[target]
// (target_weight, 0 where ignored) comes from the host, and
// mass = (1 - eps) * w[target] + eps / n * sum(w). An ignored row gathers
// column 0, so no index ever leaves [0, n).
// The smoothing sums are about m, as torch's log_softmax takes them (sum(z)
// overflows in rows of huge logits); fuse-merge-reductions puts them in
// m's pass.
//
// Backward:
// Cross-entropy backward over class indices with class weights w, from this
// pass's m = max(z), logS = log(sum(exp(z - m))) and mass, and the
// upstream gradients of each row's loss (dloss) and z-loss (dz_loss),
// both taken as 0 where target == ignore_index:
//   p = exp((z - m) - logS), lse = m + logS
//   dz = p * (dloss * mass + 2 * lse_square_scale * dz_loss * lse)
//        - dloss * ((1 - eps) * w[target] * onehot(target) + eps / n * w)
//
// Here z = softcap * tanh(logits / softcap) (Gemma 2's soft-capping), and the
// gradient with respect to the logits is dz * (1 - tanh(logits / softcap)^2).
// logits / softcap is logits times softcap_reciprocal (1 / softcap, from the
// host).
module {
  fuse.kernel @cross_entropy_weighted_capped_fwd_grad(%logits: !fuse.full<f32>, %target: !fuse.row<i64>, %weight: !fuse.col<f32>, %target_weight: !fuse.row<f32>, %dloss: !fuse.row<f32>, %dz_loss: !fuse.row<f32>, %ignore_index: !fuse.scalar<i64>, %label_smoothing: !fuse.scalar<f32>, %lse_square_scale: !fuse.scalar<f32>, %softcap: !fuse.scalar<f32>, %softcap_reciprocal: !fuse.scalar<f32>) -> (loss: !fuse.row<f32>, z_loss: !fuse.row<f32>, dlogits: !fuse.full<f32>) {
    %0 = fuse.constant full 1.000000e+00 : f32
    %1 = fuse.constant row 0.000000e+00 : f32
    %2 = fuse.constant row 0 : i64
    %3 = fuse.constant scalar 2.000000e+00 : f32
    %4 = fuse.constant scalar 0.000000e+00 : f32
    %5 = fuse.constant scalar 1.000000e+00 : f32
    %6 = fuse.broadcast %softcap_reciprocal : !fuse.scalar<f32> to !fuse.full<f32>
    %7 = fuse.mul %logits, %6 : !fuse.full<f32>
    %8 = fuse.tanh %7 : !fuse.full<f32>
    %9 = fuse.broadcast %softcap : !fuse.scalar<f32> to !fuse.full<f32>
    %10 = fuse.mul %9, %8 : !fuse.full<f32>
    %11 = fuse.sub %5, %label_smoothing : !fuse.scalar<f32>
    %12 = fuse.row_length : !fuse.scalar<f32>
    %13 = fuse.div %label_smoothing, %12 : !fuse.scalar<f32>
    %14 = fuse.broadcast %ignore_index : !fuse.scalar<i64> to !fuse.row<i64>
    %15 = fuse.cmp ne, %target, %14 : !fuse.row<i64>
    %16 = fuse.reduce max %10 : !fuse.full<f32> to !fuse.row<f32>
    %17 = fuse.broadcast %16 : !fuse.row<f32> to !fuse.full<f32>
    %18 = fuse.sub %10, %17 : !fuse.full<f32>
    %19 = fuse.exp %18 : !fuse.full<f32>
    %20 = fuse.reduce sum %19 : !fuse.full<f32> to !fuse.row<f32>
    %21 = fuse.log %20 : !fuse.row<f32>
    %22 = fuse.add %16, %21 : !fuse.row<f32>
    %23 = fuse.select %15, %target, %2 : !fuse.row<i64>
    %24 = fuse.gather %logits[%23] : !fuse.full<f32>, !fuse.row<i64> -> !fuse.row<f32>
    %25 = fuse.broadcast %softcap_reciprocal : !fuse.scalar<f32> to !fuse.row<f32>
    %26 = fuse.mul %24, %25 : !fuse.row<f32>
    %27 = fuse.tanh %26 : !fuse.row<f32>
    %28 = fuse.broadcast %softcap : !fuse.scalar<f32> to !fuse.row<f32>
    %29 = fuse.mul %28, %27 : !fuse.row<f32>
    %30 = fuse.sub %29, %16 : !fuse.row<f32>
    %31 = fuse.sub %21, %30 : !fuse.row<f32>
    %32 = fuse.broadcast %weight : !fuse.col<f32> to !fuse.full<f32>
    %33 = fuse.reduce sum %32 : !fuse.full<f32> to !fuse.row<f32>
    %34 = fuse.row_length : !fuse.scalar<f32>
    %35 = fuse.broadcast %weight : !fuse.col<f32> to !fuse.full<f32>
    %36 = fuse.mul %35, %18 : !fuse.full<f32>
    %37 = fuse.reduce sum %36 : !fuse.full<f32> to !fuse.row<f32>
    %38 = fuse.mul %33, %21 : !fuse.row<f32>
    %39 = fuse.sub %38, %37 : !fuse.row<f32>
    %40 = fuse.broadcast %34 : !fuse.scalar<f32> to !fuse.row<f32>
    %41 = fuse.div %39, %40 : !fuse.row<f32>
    %42 = fuse.mul %target_weight, %31 : !fuse.row<f32>
    %43 = fuse.broadcast %13 : !fuse.scalar<f32> to !fuse.row<f32>
    %44 = fuse.mul %43, %33 : !fuse.row<f32>
    %45 = fuse.broadcast %11 : !fuse.scalar<f32> to !fuse.row<f32>
    %46 = fuse.mul %45, %target_weight : !fuse.row<f32>
    %47 = fuse.add %46, %44 : !fuse.row<f32>
    %48 = fuse.broadcast %label_smoothing : !fuse.scalar<f32> to !fuse.row<f32>
    %49 = fuse.mul %48, %41 : !fuse.row<f32>
    %50 = fuse.cmp ne, %label_smoothing, %4 : !fuse.scalar<f32>
    %51 = fuse.broadcast %50 : !fuse.scalar<i1> to !fuse.row<i1>
    %52 = fuse.select %51, %49, %1 : !fuse.row<f32>
    %53 = fuse.broadcast %11 : !fuse.scalar<f32> to !fuse.row<f32>
    %54 = fuse.mul %53, %42 : !fuse.row<f32>
    %55 = fuse.add %54, %52 : !fuse.row<f32>
    %56 = fuse.select %15, %55, %1 : !fuse.row<f32>
    %57 = fuse.broadcast %lse_square_scale : !fuse.scalar<f32> to !fuse.row<f32>
    %58 = fuse.mul %57, %22 : !fuse.row<f32>
    %59 = fuse.mul %58, %22 : !fuse.row<f32>
    %60 = fuse.select %15, %59, %1 : !fuse.row<f32>
    %61 = fuse.broadcast %21 : !fuse.row<f32> to !fuse.full<f32>
    %62 = fuse.sub %18, %61 : !fuse.full<f32>
    %63 = fuse.exp %62 : !fuse.full<f32>
    %64 = fuse.iota : !fuse.col<i64>
    %65 = fuse.broadcast %64 : !fuse.col<i64> to !fuse.full<i64>
    %66 = fuse.broadcast %target : !fuse.row<i64> to !fuse.full<i64>
    %67 = fuse.cmp eq, %65, %66 : !fuse.full<i64>
    %68 = fuse.cast %67 : !fuse.full<i1> to !fuse.full<f32>
    %69 = fuse.broadcast %13 : !fuse.scalar<f32> to !fuse.col<f32>
    %70 = fuse.mul %69, %weight : !fuse.col<f32>
    %71 = fuse.broadcast %11 : !fuse.scalar<f32> to !fuse.row<f32>
    %72 = fuse.mul %71, %target_weight : !fuse.row<f32>
    %73 = fuse.broadcast %72 : !fuse.row<f32> to !fuse.full<f32>
    %74 = fuse.mul %73, %68 : !fuse.full<f32>
    %75 = fuse.broadcast %70 : !fuse.col<f32> to !fuse.full<f32>
    %76 = fuse.add %74, %75 : !fuse.full<f32>
    %77 = fuse.select %15, %dloss, %1 : !fuse.row<f32>
    %78 = fuse.select %15, %dz_loss, %1 : !fuse.row<f32>
    %79 = fuse.mul %lse_square_scale, %3 : !fuse.scalar<f32>
    %80 = fuse.broadcast %79 : !fuse.scalar<f32> to !fuse.row<f32>
    %81 = fuse.mul %80, %78 : !fuse.row<f32>
    %82 = fuse.mul %81, %22 : !fuse.row<f32>
    %83 = fuse.mul %77, %47 : !fuse.row<f32>
    %84 = fuse.add %83, %82 : !fuse.row<f32>
    %85 = fuse.broadcast %77 : !fuse.row<f32> to !fuse.full<f32>
    %86 = fuse.mul %85, %76 : !fuse.full<f32>
    %87 = fuse.broadcast %84 : !fuse.row<f32> to !fuse.full<f32>
    %88 = fuse.mul %63, %87 : !fuse.full<f32>
    %89 = fuse.sub %88, %86 : !fuse.full<f32>
    %90 = fuse.broadcast %softcap_reciprocal : !fuse.scalar<f32> to !fuse.full<f32>
    %91 = fuse.mul %10, %90 : !fuse.full<f32>
    %92 = fuse.mul %91, %91 : !fuse.full<f32>
    %93 = fuse.sub %0, %92 : !fuse.full<f32>
    %94 = fuse.mul %89, %93 : !fuse.full<f32>
    fuse.yield %56, %60, %94 : !fuse.row<f32>, !fuse.row<f32>, !fuse.full<f32>
  }
}
