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
//   smooth = (sum(w) * logS - sum(w * (z - m))) / n (-sum_c w_c log_softmax(z)_c / n)
//   loss   = (1 - eps) * nll + (eps != 0 ? eps * smooth : 0)
//   z_loss = lse_square_scale * lse^2
// both 0 where target == ignore_index. As in torch, the smoothing term is
// left out when eps is 0 (a -inf logit makes it inf). w[target]
// (target_weight, 0 where ignored) comes from the host; m, logS and
// mass = (1 - eps) * w[target] + eps / n * sum(w) are saved for the backward
// pass. An ignored row gathers column 0, so no index ever leaves [0, n).
// The smoothing sums are about m, as torch's log_softmax takes them (sum(z)
// overflows in rows of huge logits); fuse-merge-reductions puts them in
// m's pass.
//
// Here z = softcap * tanh(logits / softcap) (Gemma 2's soft-capping), and the
// gradient with respect to the logits is dz * (1 - tanh(logits / softcap)^2).
// logits / softcap is logits times softcap_reciprocal (1 / softcap, from the
// host).
module {
  fuse.kernel @cross_entropy_weighted_capped_fwd(%logits: !fuse.full<f32>, %target: !fuse.row<i64>, %weight: !fuse.col<f32>, %target_weight: !fuse.row<f32>, %ignore_index: !fuse.scalar<i64>, %label_smoothing: !fuse.scalar<f32>, %lse_square_scale: !fuse.scalar<f32>, %softcap: !fuse.scalar<f32>, %softcap_reciprocal: !fuse.scalar<f32>) -> (loss: !fuse.row<f32>, z_loss: !fuse.row<f32>, max: !fuse.row<f32>, log_sum: !fuse.row<f32>, mass: !fuse.row<f32>) {
    %0 = fuse.constant row 0.000000e+00 : f32
    %1 = fuse.constant row 0 : i64
    %2 = fuse.constant scalar 0.000000e+00 : f32
    %3 = fuse.constant scalar 1.000000e+00 : f32
    %4 = fuse.broadcast %softcap_reciprocal : !fuse.scalar<f32> to !fuse.full<f32>
    %5 = fuse.mul %logits, %4 : !fuse.full<f32>
    %6 = fuse.tanh %5 : !fuse.full<f32>
    %7 = fuse.broadcast %softcap : !fuse.scalar<f32> to !fuse.full<f32>
    %8 = fuse.mul %7, %6 : !fuse.full<f32>
    %9 = fuse.sub %3, %label_smoothing : !fuse.scalar<f32>
    %10 = fuse.row_length : !fuse.scalar<f32>
    %11 = fuse.div %label_smoothing, %10 : !fuse.scalar<f32>
    %12 = fuse.broadcast %ignore_index : !fuse.scalar<i64> to !fuse.row<i64>
    %13 = fuse.cmp ne, %target, %12 : !fuse.row<i64>
    %14 = fuse.reduce max %8 : !fuse.full<f32> to !fuse.row<f32>
    %15 = fuse.broadcast %14 : !fuse.row<f32> to !fuse.full<f32>
    %16 = fuse.sub %8, %15 : !fuse.full<f32>
    %17 = fuse.exp %16 : !fuse.full<f32>
    %18 = fuse.reduce sum %17 : !fuse.full<f32> to !fuse.row<f32>
    %19 = fuse.log %18 : !fuse.row<f32>
    %20 = fuse.add %14, %19 : !fuse.row<f32>
    %21 = fuse.select %13, %target, %1 : !fuse.row<i64>
    %22 = fuse.gather %logits[%21] : !fuse.full<f32>, !fuse.row<i64> -> !fuse.row<f32>
    %23 = fuse.broadcast %softcap_reciprocal : !fuse.scalar<f32> to !fuse.row<f32>
    %24 = fuse.mul %22, %23 : !fuse.row<f32>
    %25 = fuse.tanh %24 : !fuse.row<f32>
    %26 = fuse.broadcast %softcap : !fuse.scalar<f32> to !fuse.row<f32>
    %27 = fuse.mul %26, %25 : !fuse.row<f32>
    %28 = fuse.sub %27, %14 : !fuse.row<f32>
    %29 = fuse.sub %19, %28 : !fuse.row<f32>
    %30 = fuse.broadcast %weight : !fuse.col<f32> to !fuse.full<f32>
    %31 = fuse.reduce sum %30 : !fuse.full<f32> to !fuse.row<f32>
    %32 = fuse.row_length : !fuse.scalar<f32>
    %33 = fuse.broadcast %weight : !fuse.col<f32> to !fuse.full<f32>
    %34 = fuse.mul %33, %16 : !fuse.full<f32>
    %35 = fuse.reduce sum %34 : !fuse.full<f32> to !fuse.row<f32>
    %36 = fuse.mul %31, %19 : !fuse.row<f32>
    %37 = fuse.sub %36, %35 : !fuse.row<f32>
    %38 = fuse.broadcast %32 : !fuse.scalar<f32> to !fuse.row<f32>
    %39 = fuse.div %37, %38 : !fuse.row<f32>
    %40 = fuse.mul %target_weight, %29 : !fuse.row<f32>
    %41 = fuse.broadcast %11 : !fuse.scalar<f32> to !fuse.row<f32>
    %42 = fuse.mul %41, %31 : !fuse.row<f32>
    %43 = fuse.broadcast %9 : !fuse.scalar<f32> to !fuse.row<f32>
    %44 = fuse.mul %43, %target_weight : !fuse.row<f32>
    %45 = fuse.add %44, %42 : !fuse.row<f32>
    %46 = fuse.broadcast %label_smoothing : !fuse.scalar<f32> to !fuse.row<f32>
    %47 = fuse.mul %46, %39 : !fuse.row<f32>
    %48 = fuse.cmp ne, %label_smoothing, %2 : !fuse.scalar<f32>
    %49 = fuse.broadcast %48 : !fuse.scalar<i1> to !fuse.row<i1>
    %50 = fuse.select %49, %47, %0 : !fuse.row<f32>
    %51 = fuse.broadcast %9 : !fuse.scalar<f32> to !fuse.row<f32>
    %52 = fuse.mul %51, %40 : !fuse.row<f32>
    %53 = fuse.add %52, %50 : !fuse.row<f32>
    %54 = fuse.select %13, %53, %0 : !fuse.row<f32>
    %55 = fuse.broadcast %lse_square_scale : !fuse.scalar<f32> to !fuse.row<f32>
    %56 = fuse.mul %55, %20 : !fuse.row<f32>
    %57 = fuse.mul %56, %20 : !fuse.row<f32>
    %58 = fuse.select %13, %57, %0 : !fuse.row<f32>
    fuse.yield %54, %58, %14, %19, %45 : !fuse.row<f32>, !fuse.row<f32>, !fuse.row<f32>, !fuse.row<f32>, !fuse.row<f32>
  }
}
