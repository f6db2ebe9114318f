// RUN: grep -v -e '^ *//' -e '^$' %s > %t.expected
// RUN: tilefuse-opt %s | grep -v '^$' > %t.printed
// RUN: diff -u %t.expected %t.printed
// RUN: tilefuse-opt %s | tilefuse-opt | grep -v '^$' | diff -u %t.expected -
// RUN: tilefuse-opt %s -canonicalize -fuse-hoist-broadcasts | grep -v '^$' | diff -u %t.expected -
//
// One AdamW step (torch.optim.AdamW, decoupled weight decay, bias
// correction); every hyper-parameter and the step count are runtime scalars:
//   param *= 1 - lr * weight_decay
//   m = beta1 * m + (1 - beta1) * g,  v = beta2 * v + (1 - beta2) * g^2
//   param -= lr / (1 - beta1^step) * m / (sqrt(v) / sqrt(1 - beta2^step) + eps)
// Purely elementwise: the runtime may apply it to a list of tensors at once.
module {
  fuse.kernel @adamw_step(%param: !fuse.full<f32>, %grad: !fuse.full<f32>, %exp_avg: !fuse.full<f32>, %exp_avg_sq: !fuse.full<f32>, %lr: !fuse.scalar<f32>, %beta1: !fuse.scalar<f32>, %beta2: !fuse.scalar<f32>, %eps: !fuse.scalar<f32>, %weight_decay: !fuse.scalar<f32>, %step: !fuse.scalar<f32>) -> (param_out: !fuse.full<f32>, exp_avg_out: !fuse.full<f32>, exp_avg_sq_out: !fuse.full<f32>) {
    %0 = fuse.constant scalar 1.000000e+00 : f32
    // Scalar work, once per launch.
    %1 = fuse.mul %lr, %weight_decay : !fuse.scalar<f32>
    %2 = fuse.sub %0, %1 : !fuse.scalar<f32>
    %3 = fuse.sub %0, %beta1 : !fuse.scalar<f32>
    %4 = fuse.sub %0, %beta2 : !fuse.scalar<f32>
    %5 = fuse.pow %beta1, %step : !fuse.scalar<f32>
    %6 = fuse.pow %beta2, %step : !fuse.scalar<f32>
    %7 = fuse.sub %0, %5 : !fuse.scalar<f32>
    %8 = fuse.sub %0, %6 : !fuse.scalar<f32>
    %9 = fuse.div %lr, %7 : !fuse.scalar<f32>
    %10 = fuse.sqrt %8 : !fuse.scalar<f32>
    // Per element.
    %11 = fuse.broadcast %2 : !fuse.scalar<f32> to !fuse.full<f32>
    %12 = fuse.mul %param, %11 : !fuse.full<f32>
    %13 = fuse.broadcast %beta1 : !fuse.scalar<f32> to !fuse.full<f32>
    %14 = fuse.broadcast %3 : !fuse.scalar<f32> to !fuse.full<f32>
    %15 = fuse.mul %exp_avg, %13 : !fuse.full<f32>
    %16 = fuse.mul %grad, %14 : !fuse.full<f32>
    %17 = fuse.add %15, %16 : !fuse.full<f32>
    %18 = fuse.broadcast %beta2 : !fuse.scalar<f32> to !fuse.full<f32>
    %19 = fuse.broadcast %4 : !fuse.scalar<f32> to !fuse.full<f32>
    %20 = fuse.mul %grad, %grad : !fuse.full<f32>
    %21 = fuse.mul %exp_avg_sq, %18 : !fuse.full<f32>
    %22 = fuse.mul %20, %19 : !fuse.full<f32>
    %23 = fuse.add %21, %22 : !fuse.full<f32>
    %24 = fuse.sqrt %23 : !fuse.full<f32>
    %25 = fuse.broadcast %10 : !fuse.scalar<f32> to !fuse.full<f32>
    %26 = fuse.broadcast %eps : !fuse.scalar<f32> to !fuse.full<f32>
    %27 = fuse.div %24, %25 : !fuse.full<f32>
    %28 = fuse.add %27, %26 : !fuse.full<f32>
    %29 = fuse.broadcast %9 : !fuse.scalar<f32> to !fuse.full<f32>
    %30 = fuse.div %17, %28 : !fuse.full<f32>
    %31 = fuse.mul %30, %29 : !fuse.full<f32>
    %32 = fuse.sub %12, %31 : !fuse.full<f32>
    fuse.yield %32, %17, %23 : !fuse.full<f32>, !fuse.full<f32>, !fuse.full<f32>
  }
}
