// RUN: grep -v -e '^ *//' -e '^$' %s > %t.expected
// RUN: tilefuse-opt %s | grep -v '^$' > %t.printed
// RUN: diff -u %t.expected %t.printed
// RUN: tilefuse-opt %s | tilefuse-opt | grep -v '^$' | diff -u %t.expected -
// RUN: tilefuse-opt %s -canonicalize -fuse-hoist-broadcasts | grep -v '^$' | diff -u %t.expected -
//
// LayerNorm backward about the row's mean of x: layer_norm_bwd with the
// f32 rounding of the saved mean taken off (the row's mean of x - mean,
// exact differences), for f32 and f64 rows:
//   xc = x - mean,  xhat = (xc - mean(xc)) * rstd,  g = dy * weight
//   mean(g * xhat) = (mean(g * xc) - mean(xc) * mean(g)) * rstd
//   dx = rstd * (g - mean(g) - xhat * mean(g * xhat))
//   dweight = sum over rows of dy * xhat,  dbias = sum over rows of dy
module {
  fuse.kernel @layer_norm_bwd_recentered(%dy: !fuse.full<f32>, %x: !fuse.full<f32>, %weight: !fuse.col<f32>, %mean: !fuse.row<f32>, %rstd: !fuse.row<f32>) -> (dx: !fuse.full<f32>, dweight: !fuse.col<f32>, dbias: !fuse.col<f32>) {
    %0 = fuse.broadcast %mean : !fuse.row<f32> to !fuse.full<f32>
    %1 = fuse.sub %x, %0 : !fuse.full<f32>
    %2 = fuse.broadcast %weight : !fuse.col<f32> to !fuse.full<f32>
    %3 = fuse.mul %dy, %2 : !fuse.full<f32>
    %4 = fuse.reduce mean %1 : !fuse.full<f32> to !fuse.row<f32>
    %5 = fuse.reduce mean %3 : !fuse.full<f32> to !fuse.row<f32>
    %6 = fuse.mul %3, %1 : !fuse.full<f32>
    %7 = fuse.reduce mean %6 : !fuse.full<f32> to !fuse.row<f32>
    %8 = fuse.broadcast %4 : !fuse.row<f32> to !fuse.full<f32>
    %9 = fuse.sub %1, %8 : !fuse.full<f32>
    %10 = fuse.broadcast %rstd : !fuse.row<f32> to !fuse.full<f32>
    %11 = fuse.mul %9, %10 : !fuse.full<f32>
    %12 = fuse.mul %4, %5 : !fuse.row<f32>
    %13 = fuse.sub %7, %12 : !fuse.row<f32>
    %14 = fuse.mul %13, %rstd : !fuse.row<f32>
    %15 = fuse.broadcast %14 : !fuse.row<f32> to !fuse.full<f32>
    %16 = fuse.mul %11, %15 : !fuse.full<f32>
    %17 = fuse.broadcast %5 : !fuse.row<f32> to !fuse.full<f32>
    %18 = fuse.sub %3, %17 : !fuse.full<f32>
    %19 = fuse.sub %18, %16 : !fuse.full<f32>
    %20 = fuse.mul %19, %10 : !fuse.full<f32>
    %21 = fuse.mul %dy, %11 : !fuse.full<f32>
    %22 = fuse.reduce sum %21 : !fuse.full<f32> to !fuse.col<f32>
    %23 = fuse.reduce sum %dy : !fuse.full<f32> to !fuse.col<f32>
    fuse.yield %20, %22, %23 : !fuse.full<f32>, !fuse.col<f32>, !fuse.col<f32>
  }
}
