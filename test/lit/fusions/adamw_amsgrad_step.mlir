// RUN: grep -v -e '^ *//' -e '^$' %s > %t.expected
// RUN: tilefuse-opt %s | grep -v '^$' > %t.printed
// RUN: diff -u %t.expected %t.printed
// RUN: tilefuse-opt %s | tilefuse-opt | grep -v '^$' | diff -u %t.expected -
// RUN: tilefuse-opt %s -canonicalize -fuse-hoist-broadcasts | grep -v '^$' | diff -u %t.expected -
//
// One torch.optim.AdamW step with amsgrad (see adamw_step.mlir): the
// denominator uses max_exp_avg_sq = maximum(max_exp_avg_sq, v), which is
// stored as the fourth output.
module {
  fuse.kernel @adamw_amsgrad_step(%param: !fuse.full<f32>, %grad: !fuse.full<f32>, %exp_avg: !fuse.full<f32>, %exp_avg_sq: !fuse.full<f32>, %max_exp_avg_sq: !fuse.full<f32>, %grad_sign: !fuse.scalar<f32>, %decay: !fuse.scalar<f32>, %lerp_weight: !fuse.scalar<f32>, %beta2: !fuse.scalar<f32>, %one_minus_beta2: !fuse.scalar<f32>, %bias_correction2_sqrt: !fuse.scalar<f32>, %eps: !fuse.scalar<f32>, %neg_step_size: !fuse.scalar<f32>) -> (param_out: !fuse.full<f32>, exp_avg_out: !fuse.full<f32>, exp_avg_sq_out: !fuse.full<f32>, max_exp_avg_sq_out: !fuse.full<f32>) {
    %0 = fuse.constant scalar 1.000000e+00 : f32
    %1 = fuse.constant scalar 5.000000e-01 : f32
    %2 = fuse.broadcast %grad_sign : !fuse.scalar<f32> to !fuse.full<f32>
    %3 = fuse.mul %grad, %2 : !fuse.full<f32>
    %4 = fuse.broadcast %decay : !fuse.scalar<f32> to !fuse.full<f32>
    %5 = fuse.mul %param, %4 : !fuse.full<f32>
    %6 = fuse.round_to_storage %5 of %param : !fuse.full<f32>, !fuse.full<f32>
    %7 = fuse.abs %lerp_weight : !fuse.scalar<f32>
    %8 = fuse.cmp lt, %7, %1 : !fuse.scalar<f32>
    %9 = fuse.broadcast %8 : !fuse.scalar<i1> to !fuse.full<i1>
    %10 = fuse.select %9, %exp_avg, %3 : !fuse.full<f32>
    %11 = fuse.sub %3, %exp_avg : !fuse.full<f32>
    %12 = fuse.sub %lerp_weight, %0 : !fuse.scalar<f32>
    %13 = fuse.select %8, %lerp_weight, %12 : !fuse.scalar<f32>
    %14 = fuse.broadcast %13 : !fuse.scalar<f32> to !fuse.full<f32>
    %15 = fuse.fma %14, %11, %10 : !fuse.full<f32>
    %16 = fuse.round_to_storage %15 of %exp_avg : !fuse.full<f32>, !fuse.full<f32>
    %17 = fuse.broadcast %beta2 : !fuse.scalar<f32> to !fuse.full<f32>
    %18 = fuse.mul %exp_avg_sq, %17 : !fuse.full<f32>
    %19 = fuse.round_to_storage %18 of %exp_avg_sq : !fuse.full<f32>, !fuse.full<f32>
    %20 = fuse.broadcast %one_minus_beta2 : !fuse.scalar<f32> to !fuse.full<f32>
    %21 = fuse.mul %20, %3 : !fuse.full<f32>
    %22 = fuse.fma %21, %3, %19 : !fuse.full<f32>
    %23 = fuse.round_to_storage %22 of %exp_avg_sq : !fuse.full<f32>, !fuse.full<f32>
    %24 = fuse.maximum %max_exp_avg_sq, %23 : !fuse.full<f32>
    %25 = fuse.sqrt %24 : !fuse.full<f32>
    %26 = fuse.round_to_storage %25 of %max_exp_avg_sq : !fuse.full<f32>, !fuse.full<f32>
    %27 = fuse.broadcast %bias_correction2_sqrt : !fuse.scalar<f32> to !fuse.full<f32>
    %28 = fuse.div %26, %27 : !fuse.full<f32>
    %29 = fuse.round_to_storage %28 of %max_exp_avg_sq : !fuse.full<f32>, !fuse.full<f32>
    %30 = fuse.broadcast %eps : !fuse.scalar<f32> to !fuse.full<f32>
    %31 = fuse.add %29, %30 : !fuse.full<f32>
    %32 = fuse.round_to_storage %31 of %max_exp_avg_sq : !fuse.full<f32>, !fuse.full<f32>
    %33 = fuse.broadcast %neg_step_size : !fuse.scalar<f32> to !fuse.full<f32>
    %34 = fuse.mul %33, %16 : !fuse.full<f32>
    %35 = fuse.div %34, %32 : !fuse.full<f32>
    %36 = fuse.add %6, %35 : !fuse.full<f32>
    fuse.yield %36, %16, %23, %24 : !fuse.full<f32>, !fuse.full<f32>, !fuse.full<f32>, !fuse.full<f32>
  }
}
