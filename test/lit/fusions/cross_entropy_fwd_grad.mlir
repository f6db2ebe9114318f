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
// Here z is the logits themselves.
module {
  fuse.kernel @cross_entropy_fwd_grad(%logits: !fuse.full<f32>, %target: !fuse.row<i64>, %weight: !fuse.col<f32>, %target_weight: !fuse.row<f32>, %dloss: !fuse.row<f32>, %dz_loss: !fuse.row<f32>, %ignore_index: !fuse.scalar<i64>, %label_smoothing: !fuse.scalar<f32>, %lse_square_scale: !fuse.scalar<f32>) -> (loss: !fuse.row<f32>, z_loss: !fuse.row<f32>, dlogits: !fuse.full<f32>) {
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
    %21 = fuse.mul %target_weight, %20 : !fuse.row<f32>
    %22 = fuse.broadcast %weight : !fuse.col<f32> to !fuse.full<f32>
    %23 = fuse.reduce sum %22 : !fuse.full<f32> to !fuse.row<f32>
    %24 = fuse.mul %22, %logits : !fuse.full<f32>
    %25 = fuse.reduce sum %24 : !fuse.full<f32> to !fuse.row<f32>
    %26 = fuse.mul %23, %16 : !fuse.row<f32>
    %27 = fuse.sub %26, %25 : !fuse.row<f32>
    %28 = fuse.broadcast %7 : !fuse.scalar<f32> to !fuse.row<f32>
    %29 = fuse.mul %28, %27 : !fuse.row<f32>
    %30 = fuse.cmp ne, %label_smoothing, %3 : !fuse.scalar<f32>
    %31 = fuse.broadcast %30 : !fuse.scalar<i1> to !fuse.row<i1>
    %32 = fuse.select %31, %29, %0 : !fuse.row<f32>
    %33 = fuse.broadcast %5 : !fuse.scalar<f32> to !fuse.row<f32>
    %34 = fuse.mul %33, %21 : !fuse.row<f32>
    %35 = fuse.add %34, %32 : !fuse.row<f32>
    %36 = fuse.select %9, %35, %0 : !fuse.row<f32>
    %37 = fuse.mul %28, %23 : !fuse.row<f32>
    %38 = fuse.mul %33, %target_weight : !fuse.row<f32>
    %39 = fuse.add %38, %37 : !fuse.row<f32>
    %40 = fuse.broadcast %lse_square_scale : !fuse.scalar<f32> to !fuse.row<f32>
    %41 = fuse.mul %40, %16 : !fuse.row<f32>
    %42 = fuse.mul %41, %16 : !fuse.row<f32>
    %43 = fuse.select %9, %42, %0 : !fuse.row<f32>
    %44 = fuse.broadcast %15 : !fuse.row<f32> to !fuse.full<f32>
    %45 = fuse.sub %12, %44 : !fuse.full<f32>
    %46 = fuse.exp %45 : !fuse.full<f32>
    %47 = fuse.iota : !fuse.col<i64>
    %48 = fuse.broadcast %47 : !fuse.col<i64> to !fuse.full<i64>
    %49 = fuse.broadcast %target : !fuse.row<i64> to !fuse.full<i64>
    %50 = fuse.cmp eq, %48, %49 : !fuse.full<i64>
    %51 = fuse.cast %50 : !fuse.full<i1> to !fuse.full<f32>
    %52 = fuse.broadcast %7 : !fuse.scalar<f32> to !fuse.col<f32>
    %53 = fuse.mul %52, %weight : !fuse.col<f32>
    %54 = fuse.broadcast %38 : !fuse.row<f32> to !fuse.full<f32>
    %55 = fuse.mul %54, %51 : !fuse.full<f32>
    %56 = fuse.broadcast %53 : !fuse.col<f32> to !fuse.full<f32>
    %57 = fuse.add %55, %56 : !fuse.full<f32>
    %58 = fuse.select %9, %dloss, %0 : !fuse.row<f32>
    %59 = fuse.select %9, %dz_loss, %0 : !fuse.row<f32>
    %60 = fuse.mul %lse_square_scale, %2 : !fuse.scalar<f32>
    %61 = fuse.broadcast %60 : !fuse.scalar<f32> to !fuse.row<f32>
    %62 = fuse.mul %61, %59 : !fuse.row<f32>
    %63 = fuse.mul %62, %16 : !fuse.row<f32>
    %64 = fuse.mul %58, %39 : !fuse.row<f32>
    %65 = fuse.add %64, %63 : !fuse.row<f32>
    %66 = fuse.broadcast %58 : !fuse.row<f32> to !fuse.full<f32>
    %67 = fuse.mul %66, %57 : !fuse.full<f32>
    %68 = fuse.broadcast %65 : !fuse.row<f32> to !fuse.full<f32>
    %69 = fuse.mul %46, %68 : !fuse.full<f32>
    %70 = fuse.sub %69, %67 : !fuse.full<f32>
    fuse.yield %36, %43, %70 : !fuse.row<f32>, !fuse.row<f32>, !fuse.full<f32>
  }
}
