// RUN: grep -v -e '^ *//' -e '^$' %s > %t.expected
// RUN: tilefuse-opt %s | grep -v '^$' > %t.printed
// RUN: diff -u %t.expected %t.printed
// RUN: tilefuse-opt %s | tilefuse-opt | grep -v '^$' | diff -u %t.expected -
// RUN: tilefuse-opt %s -canonicalize -fuse-hoist-broadcasts | grep -v '^$' | diff -u %t.expected -
//
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
// Here z = softcap * tanh(logits / softcap) (Gemma 2's soft-capping), and the
// gradient with respect to the logits is dz * (1 - tanh(logits / softcap)^2).
module {
  fuse.kernel @cross_entropy_weighted_capped_fwd(%logits: !fuse.full<f32>, %target: !fuse.row<i64>, %weight: !fuse.col<f32>, %target_weight: !fuse.row<f32>, %ignore_index: !fuse.scalar<i64>, %label_smoothing: !fuse.scalar<f32>, %lse_square_scale: !fuse.scalar<f32>, %softcap: !fuse.scalar<f32>) -> (loss: !fuse.row<f32>, z_loss: !fuse.row<f32>, lse: !fuse.row<f32>, mass: !fuse.row<f32>) {
    %0 = fuse.constant row 0.000000e+00 : f32
    %1 = fuse.constant row 0 : i64
    %2 = fuse.constant scalar 0.000000e+00 : f32
    %3 = fuse.constant scalar 1.000000e+00 : f32
    %4 = fuse.broadcast %softcap : !fuse.scalar<f32> to !fuse.full<f32>
    %5 = fuse.div %logits, %4 : !fuse.full<f32>
    %6 = fuse.tanh %5 : !fuse.full<f32>
    %7 = fuse.mul %4, %6 : !fuse.full<f32>
    %8 = fuse.sub %3, %label_smoothing : !fuse.scalar<f32>
    %9 = fuse.row_length : !fuse.scalar<f32>
    %10 = fuse.div %label_smoothing, %9 : !fuse.scalar<f32>
    %11 = fuse.broadcast %ignore_index : !fuse.scalar<i64> to !fuse.row<i64>
    %12 = fuse.cmp ne, %target, %11 : !fuse.row<i64>
    %13 = fuse.reduce max %7 : !fuse.full<f32> to !fuse.row<f32>
    %14 = fuse.broadcast %13 : !fuse.row<f32> to !fuse.full<f32>
    %15 = fuse.sub %7, %14 : !fuse.full<f32>
    %16 = fuse.exp %15 : !fuse.full<f32>
    %17 = fuse.reduce sum %16 : !fuse.full<f32> to !fuse.row<f32>
    %18 = fuse.log %17 : !fuse.row<f32>
    %19 = fuse.add %13, %18 : !fuse.row<f32>
    %20 = fuse.select %12, %target, %1 : !fuse.row<i64>
    %21 = fuse.gather %logits[%20] : !fuse.full<f32>, !fuse.row<i64> -> !fuse.row<f32>
    %22 = fuse.broadcast %softcap : !fuse.scalar<f32> to !fuse.row<f32>
    %23 = fuse.div %21, %22 : !fuse.row<f32>
    %24 = fuse.tanh %23 : !fuse.row<f32>
    %25 = fuse.mul %22, %24 : !fuse.row<f32>
    %26 = fuse.sub %25, %13 : !fuse.row<f32>
    %27 = fuse.sub %18, %26 : !fuse.row<f32>
    %28 = fuse.broadcast %weight : !fuse.col<f32> to !fuse.full<f32>
    %29 = fuse.reduce sum %28 : !fuse.full<f32> to !fuse.row<f32>
    %30 = fuse.mul %28, %7 : !fuse.full<f32>
    %31 = fuse.reduce sum %30 : !fuse.full<f32> to !fuse.row<f32>
    %32 = fuse.mul %29, %19 : !fuse.row<f32>
    %33 = fuse.sub %32, %31 : !fuse.row<f32>
    %34 = fuse.broadcast %9 : !fuse.scalar<f32> to !fuse.row<f32>
    %35 = fuse.div %33, %34 : !fuse.row<f32>
    %36 = fuse.mul %target_weight, %27 : !fuse.row<f32>
    %37 = fuse.broadcast %10 : !fuse.scalar<f32> to !fuse.row<f32>
    %38 = fuse.mul %37, %29 : !fuse.row<f32>
    %39 = fuse.broadcast %8 : !fuse.scalar<f32> to !fuse.row<f32>
    %40 = fuse.mul %39, %target_weight : !fuse.row<f32>
    %41 = fuse.add %40, %38 : !fuse.row<f32>
    %42 = fuse.broadcast %label_smoothing : !fuse.scalar<f32> to !fuse.row<f32>
    %43 = fuse.mul %42, %35 : !fuse.row<f32>
    %44 = fuse.cmp ne, %label_smoothing, %2 : !fuse.scalar<f32>
    %45 = fuse.broadcast %44 : !fuse.scalar<i1> to !fuse.row<i1>
    %46 = fuse.select %45, %43, %0 : !fuse.row<f32>
    %47 = fuse.mul %39, %36 : !fuse.row<f32>
    %48 = fuse.add %47, %46 : !fuse.row<f32>
    %49 = fuse.select %12, %48, %0 : !fuse.row<f32>
    %50 = fuse.broadcast %lse_square_scale : !fuse.scalar<f32> to !fuse.row<f32>
    %51 = fuse.mul %50, %19 : !fuse.row<f32>
    %52 = fuse.mul %51, %19 : !fuse.row<f32>
    %53 = fuse.select %12, %52, %0 : !fuse.row<f32>
    fuse.yield %49, %53, %19, %41 : !fuse.row<f32>, !fuse.row<f32>, !fuse.row<f32>, !fuse.row<f32>
  }
}
