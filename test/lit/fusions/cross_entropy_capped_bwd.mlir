// RUN: grep -v -e '^ *//' -e '^$' %s > %t.expected
// RUN: tilefuse-opt %s | grep -v '^$' > %t.printed
// RUN: diff -u %t.expected %t.printed
// RUN: tilefuse-opt %s | tilefuse-opt | grep -v '^$' | diff -u %t.expected -
// RUN: tilefuse-opt %s -canonicalize -fuse-hoist-broadcasts | grep -v '^$' | diff -u %t.expected -
//
// Cross-entropy backward over class indices, from the forward's m = max(z)
// and logS = log(sum(exp(z - m))), and the upstream gradients of each row's
// loss (dloss) and z-loss (dz_loss), both taken as 0 where
// target == ignore_index, over n classes:
//   p = exp(z - m) * exp(-logS), lse = m + logS
//   dz = p * (dloss + 2 * lse_square_scale * dz_loss * lse)
//        - dloss * ((1 - eps) * onehot(target) + eps / n)
//
// Here z = softcap * tanh(logits / softcap) (Gemma 2's soft-capping), and the
// gradient with respect to the logits is dz * (1 - tanh(logits / softcap)^2).
// logits / softcap is logits times softcap_reciprocal (1 / softcap, from the
// host).
module {
  fuse.kernel @cross_entropy_capped_bwd(%logits: !fuse.full<f32>, %target: !fuse.row<i64>, %max: !fuse.row<f32>, %log_sum: !fuse.row<f32>, %dloss: !fuse.row<f32>, %dz_loss: !fuse.row<f32>, %ignore_index: !fuse.scalar<i64>, %label_smoothing: !fuse.scalar<f32>, %lse_square_scale: !fuse.scalar<f32>, %softcap: !fuse.scalar<f32>, %softcap_reciprocal: !fuse.scalar<f32>) -> (dlogits: !fuse.full<f32>) {
    %0 = fuse.constant full 1.000000e+00 : f32
    %1 = fuse.constant row 0.000000e+00 : f32
    %2 = fuse.constant scalar 2.000000e+00 : f32
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
    %14 = fuse.broadcast %max : !fuse.row<f32> to !fuse.full<f32>
    %15 = fuse.sub %8, %14 : !fuse.full<f32>
    %16 = fuse.add %max, %log_sum : !fuse.row<f32>
    %17 = fuse.exp %15 : !fuse.full<f32>
    %18 = fuse.iota : !fuse.col<i64>
    %19 = fuse.broadcast %18 : !fuse.col<i64> to !fuse.full<i64>
    %20 = fuse.broadcast %target : !fuse.row<i64> to !fuse.full<i64>
    %21 = fuse.cmp eq, %19, %20 : !fuse.full<i64>
    %22 = fuse.cast %21 : !fuse.full<i1> to !fuse.full<f32>
    %23 = fuse.broadcast %9 : !fuse.scalar<f32> to !fuse.full<f32>
    %24 = fuse.mul %23, %22 : !fuse.full<f32>
    %25 = fuse.broadcast %11 : !fuse.scalar<f32> to !fuse.full<f32>
    %26 = fuse.add %24, %25 : !fuse.full<f32>
    %27 = fuse.select %13, %dloss, %1 : !fuse.row<f32>
    %28 = fuse.select %13, %dz_loss, %1 : !fuse.row<f32>
    %29 = fuse.mul %lse_square_scale, %2 : !fuse.scalar<f32>
    %30 = fuse.broadcast %29 : !fuse.scalar<f32> to !fuse.row<f32>
    %31 = fuse.mul %30, %28 : !fuse.row<f32>
    %32 = fuse.mul %31, %16 : !fuse.row<f32>
    %33 = fuse.add %27, %32 : !fuse.row<f32>
    %34 = fuse.neg %log_sum : !fuse.row<f32>
    %35 = fuse.exp %34 : !fuse.row<f32>
    %36 = fuse.mul %35, %33 : !fuse.row<f32>
    %37 = fuse.broadcast %27 : !fuse.row<f32> to !fuse.full<f32>
    %38 = fuse.mul %37, %26 : !fuse.full<f32>
    %39 = fuse.broadcast %36 : !fuse.row<f32> to !fuse.full<f32>
    %40 = fuse.mul %17, %39 : !fuse.full<f32>
    %41 = fuse.sub %40, %38 : !fuse.full<f32>
    %42 = fuse.broadcast %softcap_reciprocal : !fuse.scalar<f32> to !fuse.full<f32>
    %43 = fuse.mul %8, %42 : !fuse.full<f32>
    %44 = fuse.mul %43, %43 : !fuse.full<f32>
    %45 = fuse.sub %0, %44 : !fuse.full<f32>
    %46 = fuse.mul %41, %45 : !fuse.full<f32>
    fuse.yield %46 : !fuse.full<f32>
  }
}
