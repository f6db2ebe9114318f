// RUN: grep -v -e '^ *//' -e '^$' %s > %t.expected
// RUN: tilefuse-opt %s | grep -v '^$' > %t.printed
// RUN: diff -u %t.expected %t.printed
// RUN: tilefuse-opt %s | tilefuse-opt | grep -v '^$' | diff -u %t.expected -
// RUN: tilefuse-opt %s -canonicalize -fuse-hoist-broadcasts | grep -v '^$' | diff -u %t.expected -
//
// LayerNorm backward, from the saved mean and rstd:
//   xhat = (x - mean) * rstd,  g = dy * weight
//   dx = rstd * (g - mean(g) - xhat * mean(g * xhat))
//   dweight = sum over rows of dy * xhat,  dbias = sum over rows of dy
module {
  fuse.kernel @layer_norm_bwd(%dy: !fuse.full<f32>, %x: !fuse.full<f32>, %weight: !fuse.col<f32>, %mean: !fuse.row<f32>, %rstd: !fuse.row<f32>) -> (dx: !fuse.full<f32>, dweight: !fuse.col<f32>, dbias: !fuse.col<f32>) {
    %0 = fuse.broadcast %mean : !fuse.row<f32> to !fuse.full<f32>
    %1 = fuse.sub %x, %0 : !fuse.full<f32>
    %2 = fuse.broadcast %rstd : !fuse.row<f32> to !fuse.full<f32>
    %3 = fuse.mul %1, %2 : !fuse.full<f32>
    %4 = fuse.broadcast %weight : !fuse.col<f32> to !fuse.full<f32>
    %5 = fuse.mul %dy, %4 : !fuse.full<f32>
    %6 = fuse.reduce mean %5 : !fuse.full<f32> to !fuse.row<f32>
    %7 = fuse.mul %5, %3 : !fuse.full<f32>
    %8 = fuse.reduce mean %7 : !fuse.full<f32> to !fuse.row<f32>
    %9 = fuse.broadcast %6 : !fuse.row<f32> to !fuse.full<f32>
    %10 = fuse.broadcast %8 : !fuse.row<f32> to !fuse.full<f32>
    %11 = fuse.sub %5, %9 : !fuse.full<f32>
    %12 = fuse.mul %3, %10 : !fuse.full<f32>
    %13 = fuse.sub %11, %12 : !fuse.full<f32>
    %14 = fuse.mul %13, %2 : !fuse.full<f32>
    %15 = fuse.mul %dy, %3 : !fuse.full<f32>
    %16 = fuse.reduce sum %15 : !fuse.full<f32> to !fuse.col<f32>
    %17 = fuse.reduce sum %dy : !fuse.full<f32> to !fuse.col<f32>
    fuse.yield %14, %16, %17 : !fuse.full<f32>, !fuse.col<f32>, !fuse.col<f32>
  }
}
