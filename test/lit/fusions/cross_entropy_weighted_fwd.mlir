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
// Here z is the logits themselves.
module {
  fuse.kernel @cross_entropy_weighted_fwd(%logits: !fuse.full<f32>, %target: !fuse.row<i64>, %weight: !fuse.col<f32>, %target_weight: !fuse.row<f32>, %ignore_index: !fuse.scalar<i64>, %label_smoothing: !fuse.scalar<f32>, %lse_square_scale: !fuse.scalar<f32>) -> (loss: !fuse.row<f32>, z_loss: !fuse.row<f32>, max: !fuse.row<f32>, log_sum: !fuse.row<f32>, mass: !fuse.row<f32>) {
    %0 = fuse.constant row 0.000000e+00 : f32
    %1 = fuse.constant row 0 : i64
    %2 = fuse.constant scalar 0.000000e+00 : f32
    %3 = fuse.constant scalar 1.000000e+00 : f32
    %4 = fuse.sub %3, %label_smoothing : !fuse.scalar<f32>
    %5 = fuse.row_length : !fuse.scalar<f32>
    %6 = fuse.div %label_smoothing, %5 : !fuse.scalar<f32>
    %7 = fuse.broadcast %ignore_index : !fuse.scalar<i64> to !fuse.row<i64>
    %8 = fuse.cmp ne, %target, %7 : !fuse.row<i64>
    %9 = fuse.reduce max %logits : !fuse.full<f32> to !fuse.row<f32>
    %10 = fuse.broadcast %9 : !fuse.row<f32> to !fuse.full<f32>
    %11 = fuse.sub %logits, %10 : !fuse.full<f32>
    %12 = fuse.exp %11 : !fuse.full<f32>
    %13 = fuse.reduce sum %12 : !fuse.full<f32> to !fuse.row<f32>
    %14 = fuse.log %13 : !fuse.row<f32>
    %15 = fuse.add %9, %14 : !fuse.row<f32>
    %16 = fuse.select %8, %target, %1 : !fuse.row<i64>
    %17 = fuse.gather %logits[%16] : !fuse.full<f32>, !fuse.row<i64> -> !fuse.row<f32>
    %18 = fuse.sub %17, %9 : !fuse.row<f32>
    %19 = fuse.sub %14, %18 : !fuse.row<f32>
    %20 = fuse.broadcast %weight : !fuse.col<f32> to !fuse.full<f32>
    %21 = fuse.reduce sum %20 : !fuse.full<f32> to !fuse.row<f32>
    %22 = fuse.row_length : !fuse.scalar<f32>
    %23 = fuse.broadcast %weight : !fuse.col<f32> to !fuse.full<f32>
    %24 = fuse.mul %23, %11 : !fuse.full<f32>
    %25 = fuse.reduce sum %24 : !fuse.full<f32> to !fuse.row<f32>
    %26 = fuse.mul %21, %14 : !fuse.row<f32>
    %27 = fuse.sub %26, %25 : !fuse.row<f32>
    %28 = fuse.broadcast %22 : !fuse.scalar<f32> to !fuse.row<f32>
    %29 = fuse.div %27, %28 : !fuse.row<f32>
    %30 = fuse.mul %target_weight, %19 : !fuse.row<f32>
    %31 = fuse.broadcast %6 : !fuse.scalar<f32> to !fuse.row<f32>
    %32 = fuse.mul %31, %21 : !fuse.row<f32>
    %33 = fuse.broadcast %4 : !fuse.scalar<f32> to !fuse.row<f32>
    %34 = fuse.mul %33, %target_weight : !fuse.row<f32>
    %35 = fuse.add %34, %32 : !fuse.row<f32>
    %36 = fuse.broadcast %label_smoothing : !fuse.scalar<f32> to !fuse.row<f32>
    %37 = fuse.mul %36, %29 : !fuse.row<f32>
    %38 = fuse.cmp ne, %label_smoothing, %2 : !fuse.scalar<f32>
    %39 = fuse.broadcast %38 : !fuse.scalar<i1> to !fuse.row<i1>
    %40 = fuse.select %39, %37, %0 : !fuse.row<f32>
    %41 = fuse.broadcast %4 : !fuse.scalar<f32> to !fuse.row<f32>
    %42 = fuse.mul %41, %30 : !fuse.row<f32>
    %43 = fuse.add %42, %40 : !fuse.row<f32>
    %44 = fuse.select %8, %43, %0 : !fuse.row<f32>
    %45 = fuse.broadcast %lse_square_scale : !fuse.scalar<f32> to !fuse.row<f32>
    %46 = fuse.mul %45, %15 : !fuse.row<f32>
    %47 = fuse.mul %46, %15 : !fuse.row<f32>
    %48 = fuse.select %8, %47, %0 : !fuse.row<f32>
    fuse.yield %44, %48, %9, %14, %35 : !fuse.row<f32>, !fuse.row<f32>, !fuse.row<f32>, !fuse.row<f32>, !fuse.row<f32>
  }
}
