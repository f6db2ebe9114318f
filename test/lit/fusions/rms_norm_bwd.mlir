// RUN: grep -v -e '^ *//' -e '^$' %s > %t.expected
// RUN: tilefuse-opt %s | grep -v '^$' > %t.printed
// RUN: diff -u %t.expected %t.printed
// RUN: tilefuse-opt %s | tilefuse-opt | grep -v '^$' | diff -u %t.expected -
// RUN: tilefuse-opt %s -canonicalize -fuse-hoist-broadcasts | grep -v '^$' | diff -u %t.expected -
//
// RMSNorm backward ("gemma" casting), from the saved rstd:
//   xhat = x * rstd,  g = dy * (offset + weight)
//   dx = rstd * (g - xhat * mean(g * xhat))
//   dweight = sum over rows of dy * xhat   (a column reduction)
module {
  fuse.kernel @rms_norm_bwd(%dy: !fuse.full<f32>, %x: !fuse.full<f32>, %weight: !fuse.col<f32>, %rstd: !fuse.row<f32>, %offset: !fuse.scalar<f32>) -> (dx: !fuse.full<f32>, dweight: !fuse.col<f32>) {
    %0 = fuse.broadcast %rstd : !fuse.row<f32> to !fuse.full<f32>
    %1 = fuse.mul %x, %0 : !fuse.full<f32>
    %2 = fuse.broadcast %offset : !fuse.scalar<f32> to !fuse.col<f32>
    %3 = fuse.add %2, %weight : !fuse.col<f32>
    %4 = fuse.broadcast %3 : !fuse.col<f32> to !fuse.full<f32>
    %5 = fuse.mul %dy, %4 : !fuse.full<f32>
    %6 = fuse.mul %5, %1 : !fuse.full<f32>
    %7 = fuse.reduce mean %6 : !fuse.full<f32> to !fuse.row<f32>
    %8 = fuse.broadcast %7 : !fuse.row<f32> to !fuse.full<f32>
    %9 = fuse.mul %1, %8 : !fuse.full<f32>
    %10 = fuse.sub %5, %9 : !fuse.full<f32>
    %11 = fuse.mul %10, %0 : !fuse.full<f32>
    %12 = fuse.mul %dy, %1 : !fuse.full<f32>
    %13 = fuse.reduce sum %12 : !fuse.full<f32> to !fuse.col<f32>
    fuse.yield %11, %13 : !fuse.full<f32>, !fuse.col<f32>
  }
}
