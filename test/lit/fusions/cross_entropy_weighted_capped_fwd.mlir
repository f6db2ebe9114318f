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
// logits / softcap is logits times softcap_reciprocal (1 / softcap, from the
// host).
module {
  fuse.kernel @cross_entropy_weighted_capped_fwd(%logits: !fuse.full<f32>, %target: !fuse.row<i64>, %weight: !fuse.col<f32>, %target_weight: !fuse.row<f32>, %ignore_index: !fuse.scalar<i64>, %label_smoothing: !fuse.scalar<f32>, %lse_square_scale: !fuse.scalar<f32>, %softcap: !fuse.scalar<f32>, %softcap_reciprocal: !fuse.scalar<f32>) -> (loss: !fuse.row<f32>, z_loss: !fuse.row<f32>, lse: !fuse.row<f32>, mass: !fuse.row<f32>) {
    %0 = fuse.constant scalar 0.000000e+00 : f32
    %1 = fuse.constant row 0 : i64
    %2 = fuse.constant row 0.000000e+00 : f32
    %3 = fuse.constant scalar 1.000000e+00 : f32
    %4 = fuse.broadcast %softcap_reciprocal : !fuse.scalar<f32> to !fuse.full<f32>
    %5 = fuse.broadcast %softcap_reciprocal : !fuse.scalar<f32> to !fuse.row<f32>
    %6 = fuse.broadcast %softcap : !fuse.scalar<f32> to !fuse.full<f32>
    %7 = fuse.mul %logits, %4 : !fuse.full<f32>
    %8 = fuse.tanh %7 : !fuse.full<f32>
    %9 = fuse.mul %6, %8 : !fuse.full<f32>
    %10 = fuse.sub %3, %label_smoothing : !fuse.scalar<f32>
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
    %22 = fuse.select %14, %target, %1 : !fuse.row<i64>
    %23 = fuse.gather %logits[%22] : !fuse.full<f32>, !fuse.row<i64> -> !fuse.row<f32>
    %24 = fuse.broadcast %softcap : !fuse.scalar<f32> to !fuse.row<f32>
    %25 = fuse.mul %23, %5 : !fuse.row<f32>
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
    %46 = fuse.cmp ne, %label_smoothing, %0 : !fuse.scalar<f32>
    %47 = fuse.broadcast %46 : !fuse.scalar<i1> to !fuse.row<i1>
    %48 = fuse.select %47, %45, %2 : !fuse.row<f32>
    %49 = fuse.mul %41, %38 : !fuse.row<f32>
    %50 = fuse.add %49, %48 : !fuse.row<f32>
    %51 = fuse.select %14, %50, %2 : !fuse.row<f32>
    %52 = fuse.broadcast %lse_square_scale : !fuse.scalar<f32> to !fuse.row<f32>
    %53 = fuse.mul %52, %21 : !fuse.row<f32>
    %54 = fuse.mul %53, %21 : !fuse.row<f32>
    %55 = fuse.select %14, %54, %2 : !fuse.row<f32>
    fuse.yield %51, %55, %21, %43 : !fuse.row<f32>, !fuse.row<f32>, !fuse.row<f32>, !fuse.row<f32>
  }
}
