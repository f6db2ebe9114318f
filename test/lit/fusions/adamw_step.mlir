// RUN: grep -v -e '^ *//' -e '^$' %s > %t.expected
// RUN: tilefuse-opt %s | grep -v '^$' > %t.printed
// RUN: diff -u %t.expected %t.printed
// RUN: tilefuse-opt %s | tilefuse-opt | grep -v '^$' | diff -u %t.expected -
// RUN: tilefuse-opt %s -canonicalize -fuse-hoist-broadcasts | grep -v '^$' | diff -u %t.expected -
//
// One torch.optim.AdamW step (foreach=False, decoupled weight decay),
// operation for operation. The host computes the step's scalars in f64:
//   grad_sign = -1 if maximize else 1,  decay = 1 - lr * weight_decay,
//   lerp_weight = 1 - beta1,  one_minus_beta2 = 1 - beta2,
//   bias_correction2_sqrt = sqrt(1 - beta2^step),
//   neg_step_size = -lr / (1 - beta1^step)
// The kernel then does what PyTorch's in-place ops do, each rounded to the
// storage dtype of the tensor it updates (a no-op for f32):
//   g = grad * grad_sign;  p = param * decay
//   m = exp_avg.lerp(g, lerp_weight)     (one FMA, as ATen's lerp)
//   v = exp_avg_sq * beta2 + (one_minus_beta2 * g) * g   (one FMA, addcmul)
//   denom = sqrt(v) / bias_correction2_sqrt + eps
//   param_out = p + neg_step_size * m / denom    (addcdiv)
// Purely elementwise: the runtime may apply it to a list of tensors at once.
module {
  fuse.kernel @adamw_step(%param: !fuse.full<f32>, %grad: !fuse.full<f32>, %exp_avg: !fuse.full<f32>, %exp_avg_sq: !fuse.full<f32>, %grad_sign: !fuse.scalar<f32>, %decay: !fuse.scalar<f32>, %lerp_weight: !fuse.scalar<f32>, %beta2: !fuse.scalar<f32>, %one_minus_beta2: !fuse.scalar<f32>, %bias_correction2_sqrt: !fuse.scalar<f32>, %eps: !fuse.scalar<f32>, %neg_step_size: !fuse.scalar<f32>) -> (param_out: !fuse.full<f32>, exp_avg_out: !fuse.full<f32>, exp_avg_sq_out: !fuse.full<f32>) {
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
    %24 = fuse.sqrt %23 : !fuse.full<f32>
    %25 = fuse.round_to_storage %24 of %exp_avg_sq : !fuse.full<f32>, !fuse.full<f32>
    %26 = fuse.broadcast %bias_correction2_sqrt : !fuse.scalar<f32> to !fuse.full<f32>
    %27 = fuse.div %25, %26 : !fuse.full<f32>
    %28 = fuse.round_to_storage %27 of %exp_avg_sq : !fuse.full<f32>, !fuse.full<f32>
    %29 = fuse.broadcast %eps : !fuse.scalar<f32> to !fuse.full<f32>
    %30 = fuse.add %28, %29 : !fuse.full<f32>
    %31 = fuse.round_to_storage %30 of %exp_avg_sq : !fuse.full<f32>, !fuse.full<f32>
    %32 = fuse.broadcast %neg_step_size : !fuse.scalar<f32> to !fuse.full<f32>
    %33 = fuse.mul %32, %16 : !fuse.full<f32>
    %34 = fuse.div %33, %31 : !fuse.full<f32>
    %35 = fuse.add %6, %34 : !fuse.full<f32>
    fuse.yield %35, %16, %23 : !fuse.full<f32>, !fuse.full<f32>, !fuse.full<f32>
  }
}
