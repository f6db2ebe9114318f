// RUN: grep -v -e '^ *//' -e '^$' %s > %t.expected
// RUN: tilefuse-opt %s | grep -v '^$' > %t.printed
// RUN: diff -u %t.expected %t.printed
// RUN: tilefuse-opt %s | tilefuse-opt | grep -v '^$' | diff -u %t.expected -
// RUN: tilefuse-opt %s -canonicalize -fuse-hoist-broadcasts | grep -v '^$' | diff -u %t.expected -
//
// RMSNorm backward, from the saved rstd:
//   xhat = x * rstd,  g = dy * weight
//   dx = rstd * (g - xhat * mean(g * xhat))
//   dweight = sum over rows of dy * xhat   (a column reduction)
module {
  fuse.kernel @rms_norm_bwd(%dy: !fuse.full<f32>, %x: !fuse.full<f32>, %weight: !fuse.col<f32>, %rstd: !fuse.row<f32>) -> (dx: !fuse.full<f32>, dweight: !fuse.col<f32>) {
    %0 = fuse.broadcast %rstd : !fuse.row<f32> to !fuse.full<f32>
    %1 = fuse.mul %x, %0 : !fuse.full<f32>
    %2 = fuse.broadcast %weight : !fuse.col<f32> to !fuse.full<f32>
    %3 = fuse.mul %dy, %2 : !fuse.full<f32>
    %4 = fuse.mul %3, %1 : !fuse.full<f32>
    %5 = fuse.reduce mean %4 : !fuse.full<f32> to !fuse.row<f32>
    %6 = fuse.broadcast %5 : !fuse.row<f32> to !fuse.full<f32>
    %7 = fuse.mul %1, %6 : !fuse.full<f32>
    %8 = fuse.sub %3, %7 : !fuse.full<f32>
    %9 = fuse.mul %8, %0 : !fuse.full<f32>
    %10 = fuse.mul %dy, %1 : !fuse.full<f32>
    %11 = fuse.reduce sum %10 : !fuse.full<f32> to !fuse.col<f32>
    fuse.yield %9, %11 : !fuse.full<f32>, !fuse.col<f32>
  }
}
