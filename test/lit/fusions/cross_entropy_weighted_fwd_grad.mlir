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
    %23 = fuse.mul %21, %logits : !fuse.full<f32>
    %24 = fuse.reduce sum %23 : !fuse.full<f32> to !fuse.row<f32>
    %25 = fuse.mul %22, %16 : !fuse.row<f32>
    %26 = fuse.sub %25, %24 : !fuse.row<f32>
    %27 = fuse.broadcast %6 : !fuse.scalar<f32> to !fuse.row<f32>
    %28 = fuse.div %26, %27 : !fuse.row<f32>
    %29 = fuse.mul %target_weight, %20 : !fuse.row<f32>
    %30 = fuse.broadcast %7 : !fuse.scalar<f32> to !fuse.row<f32>
    %31 = fuse.mul %30, %22 : !fuse.row<f32>
    %32 = fuse.broadcast %5 : !fuse.scalar<f32> to !fuse.row<f32>
    %33 = fuse.mul %32, %target_weight : !fuse.row<f32>
    %34 = fuse.add %33, %31 : !fuse.row<f32>
    %35 = fuse.broadcast %label_smoothing : !fuse.scalar<f32> to !fuse.row<f32>
    %36 = fuse.mul %35, %28 : !fuse.row<f32>
    %37 = fuse.cmp ne, %label_smoothing, %3 : !fuse.scalar<f32>
    %38 = fuse.broadcast %37 : !fuse.scalar<i1> to !fuse.row<i1>
    %39 = fuse.select %38, %36, %0 : !fuse.row<f32>
    %40 = fuse.mul %32, %29 : !fuse.row<f32>
    %41 = fuse.add %40, %39 : !fuse.row<f32>
    %42 = fuse.select %9, %41, %0 : !fuse.row<f32>
    %43 = fuse.broadcast %lse_square_scale : !fuse.scalar<f32> to !fuse.row<f32>
    %44 = fuse.mul %43, %16 : !fuse.row<f32>
    %45 = fuse.mul %44, %16 : !fuse.row<f32>
    %46 = fuse.select %9, %45, %0 : !fuse.row<f32>
    %47 = fuse.broadcast %15 : !fuse.row<f32> to !fuse.full<f32>
    %48 = fuse.sub %12, %47 : !fuse.full<f32>
    %49 = fuse.exp %48 : !fuse.full<f32>
    %50 = fuse.iota : !fuse.col<i64>
    %51 = fuse.broadcast %50 : !fuse.col<i64> to !fuse.full<i64>
    %52 = fuse.broadcast %target : !fuse.row<i64> to !fuse.full<i64>
    %53 = fuse.cmp eq, %51, %52 : !fuse.full<i64>
    %54 = fuse.cast %53 : !fuse.full<i1> to !fuse.full<f32>
    %55 = fuse.broadcast %7 : !fuse.scalar<f32> to !fuse.col<f32>
    %56 = fuse.mul %55, %weight : !fuse.col<f32>
    %57 = fuse.broadcast %33 : !fuse.row<f32> to !fuse.full<f32>
    %58 = fuse.mul %57, %54 : !fuse.full<f32>
    %59 = fuse.broadcast %56 : !fuse.col<f32> to !fuse.full<f32>
    %60 = fuse.add %58, %59 : !fuse.full<f32>
    %61 = fuse.select %9, %dloss, %0 : !fuse.row<f32>
    %62 = fuse.select %9, %dz_loss, %0 : !fuse.row<f32>
    %63 = fuse.mul %lse_square_scale, %2 : !fuse.scalar<f32>
    %64 = fuse.broadcast %63 : !fuse.scalar<f32> to !fuse.row<f32>
    %65 = fuse.mul %64, %62 : !fuse.row<f32>
    %66 = fuse.mul %65, %16 : !fuse.row<f32>
    %67 = fuse.mul %61, %34 : !fuse.row<f32>
    %68 = fuse.add %67, %66 : !fuse.row<f32>
    %69 = fuse.broadcast %61 : !fuse.row<f32> to !fuse.full<f32>
    %70 = fuse.mul %69, %60 : !fuse.full<f32>
    %71 = fuse.broadcast %68 : !fuse.row<f32> to !fuse.full<f32>
    %72 = fuse.mul %49, %71 : !fuse.full<f32>
    %73 = fuse.sub %72, %70 : !fuse.full<f32>
    fuse.yield %42, %46, %73 : !fuse.row<f32>, !fuse.row<f32>, !fuse.full<f32>
  }
}
