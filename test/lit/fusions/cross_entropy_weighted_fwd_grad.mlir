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
// Here z is the logits themselves.
module {
  fuse.kernel @cross_entropy_weighted_fwd_grad(%logits: !fuse.full<f32>, %target: !fuse.row<i64>, %weight: !fuse.col<f32>, %target_weight: !fuse.row<f32>, %dloss: !fuse.row<f32>, %dz_loss: !fuse.row<f32>, %ignore_index: !fuse.scalar<i64>, %label_smoothing: !fuse.scalar<f32>, %lse_square_scale: !fuse.scalar<f32>) -> (loss: !fuse.row<f32>, z_loss: !fuse.row<f32>, dlogits: !fuse.full<f32>) {
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
    %21 = fuse.broadcast %weight : !fuse.col<f32> to !fuse.full<f32>
    %22 = fuse.reduce sum %21 : !fuse.full<f32> to !fuse.row<f32>
    %23 = fuse.row_length : !fuse.scalar<f32>
    %24 = fuse.broadcast %weight : !fuse.col<f32> to !fuse.full<f32>
    %25 = fuse.mul %24, %12 : !fuse.full<f32>
    %26 = fuse.reduce sum %25 : !fuse.full<f32> to !fuse.row<f32>
    %27 = fuse.mul %22, %15 : !fuse.row<f32>
    %28 = fuse.sub %27, %26 : !fuse.row<f32>
    %29 = fuse.broadcast %23 : !fuse.scalar<f32> to !fuse.row<f32>
    %30 = fuse.div %28, %29 : !fuse.row<f32>
    %31 = fuse.mul %target_weight, %20 : !fuse.row<f32>
    %32 = fuse.broadcast %7 : !fuse.scalar<f32> to !fuse.row<f32>
    %33 = fuse.mul %32, %22 : !fuse.row<f32>
    %34 = fuse.broadcast %5 : !fuse.scalar<f32> to !fuse.row<f32>
    %35 = fuse.mul %34, %target_weight : !fuse.row<f32>
    %36 = fuse.add %35, %33 : !fuse.row<f32>
    %37 = fuse.broadcast %label_smoothing : !fuse.scalar<f32> to !fuse.row<f32>
    %38 = fuse.mul %37, %30 : !fuse.row<f32>
    %39 = fuse.cmp ne, %label_smoothing, %3 : !fuse.scalar<f32>
    %40 = fuse.broadcast %39 : !fuse.scalar<i1> to !fuse.row<i1>
    %41 = fuse.select %40, %38, %0 : !fuse.row<f32>
    %42 = fuse.broadcast %5 : !fuse.scalar<f32> to !fuse.row<f32>
    %43 = fuse.mul %42, %31 : !fuse.row<f32>
    %44 = fuse.add %43, %41 : !fuse.row<f32>
    %45 = fuse.select %9, %44, %0 : !fuse.row<f32>
    %46 = fuse.broadcast %lse_square_scale : !fuse.scalar<f32> to !fuse.row<f32>
    %47 = fuse.mul %46, %16 : !fuse.row<f32>
    %48 = fuse.mul %47, %16 : !fuse.row<f32>
    %49 = fuse.select %9, %48, %0 : !fuse.row<f32>
    %50 = fuse.broadcast %15 : !fuse.row<f32> to !fuse.full<f32>
    %51 = fuse.sub %12, %50 : !fuse.full<f32>
    %52 = fuse.exp %51 : !fuse.full<f32>
    %53 = fuse.iota : !fuse.col<i64>
    %54 = fuse.broadcast %53 : !fuse.col<i64> to !fuse.full<i64>
    %55 = fuse.broadcast %target : !fuse.row<i64> to !fuse.full<i64>
    %56 = fuse.cmp eq, %54, %55 : !fuse.full<i64>
    %57 = fuse.cast %56 : !fuse.full<i1> to !fuse.full<f32>
    %58 = fuse.broadcast %7 : !fuse.scalar<f32> to !fuse.col<f32>
    %59 = fuse.mul %58, %weight : !fuse.col<f32>
    %60 = fuse.broadcast %5 : !fuse.scalar<f32> to !fuse.row<f32>
    %61 = fuse.mul %60, %target_weight : !fuse.row<f32>
    %62 = fuse.broadcast %61 : !fuse.row<f32> to !fuse.full<f32>
    %63 = fuse.mul %62, %57 : !fuse.full<f32>
    %64 = fuse.broadcast %59 : !fuse.col<f32> to !fuse.full<f32>
    %65 = fuse.add %63, %64 : !fuse.full<f32>
    %66 = fuse.select %9, %dloss, %0 : !fuse.row<f32>
    %67 = fuse.select %9, %dz_loss, %0 : !fuse.row<f32>
    %68 = fuse.mul %lse_square_scale, %2 : !fuse.scalar<f32>
    %69 = fuse.broadcast %68 : !fuse.scalar<f32> to !fuse.row<f32>
    %70 = fuse.mul %69, %67 : !fuse.row<f32>
    %71 = fuse.mul %70, %16 : !fuse.row<f32>
    %72 = fuse.mul %66, %36 : !fuse.row<f32>
    %73 = fuse.add %72, %71 : !fuse.row<f32>
    %74 = fuse.broadcast %66 : !fuse.row<f32> to !fuse.full<f32>
    %75 = fuse.mul %74, %65 : !fuse.full<f32>
    %76 = fuse.broadcast %73 : !fuse.row<f32> to !fuse.full<f32>
    %77 = fuse.mul %52, %76 : !fuse.full<f32>
    %78 = fuse.sub %77, %75 : !fuse.full<f32>
    fuse.yield %45, %49, %78 : !fuse.row<f32>, !fuse.row<f32>, !fuse.full<f32>
  }
}
