// RUN: grep -v -e '^ *//' -e '^$' %s > %t.expected
// RUN: tilefuse-opt %s | grep -v '^$' > %t.printed
// RUN: diff -u %t.expected %t.printed
// RUN: tilefuse-opt %s | tilefuse-opt | grep -v '^$' | diff -u %t.expected -
// RUN: tilefuse-opt %s -canonicalize -fuse-hoist-broadcasts | grep -v '^$' | diff -u %t.expected -
//
// LayerNorm forward (torch.nn.functional.layer_norm, biased variance):
//   mean = mean(x),  rstd = 1 / sqrt(mean((x - mean)^2) + eps)
//   y = (x - mean) * rstd * weight + bias
// mean and rstd are saved for the backward pass.
module {
  fuse.kernel @layer_norm_fwd(%x: !fuse.full<f32>, %weight: !fuse.col<f32>, %bias: !fuse.col<f32>, %eps: !fuse.scalar<f32>) -> (y: !fuse.full<f32>, mean: !fuse.row<f32>, rstd: !fuse.row<f32>) {
    %0 = fuse.reduce mean %x : !fuse.full<f32> to !fuse.row<f32>
    %1 = fuse.broadcast %0 : !fuse.row<f32> to !fuse.full<f32>
    %2 = fuse.sub %x, %1 : !fuse.full<f32>
    %3 = fuse.mul %2, %2 : !fuse.full<f32>
    %4 = fuse.reduce mean %3 : !fuse.full<f32> to !fuse.row<f32>
    %5 = fuse.broadcast %eps : !fuse.scalar<f32> to !fuse.row<f32>
    %6 = fuse.add %4, %5 : !fuse.row<f32>
    %7 = fuse.rsqrt %6 : !fuse.row<f32>
    %8 = fuse.broadcast %7 : !fuse.row<f32> to !fuse.full<f32>
    %9 = fuse.mul %2, %8 : !fuse.full<f32>
    %10 = fuse.broadcast %weight : !fuse.col<f32> to !fuse.full<f32>
    %11 = fuse.mul %9, %10 : !fuse.full<f32>
    %12 = fuse.broadcast %bias : !fuse.col<f32> to !fuse.full<f32>
    %13 = fuse.add %11, %12 : !fuse.full<f32>
    fuse.yield %13, %0, %7 : !fuse.full<f32>, !fuse.row<f32>, !fuse.row<f32>
  }
}
