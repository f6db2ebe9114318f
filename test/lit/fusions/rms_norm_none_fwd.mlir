// RUN: grep -v -e '^ *//' -e '^$' %s > %t.expected
// RUN: tilefuse-opt %s | grep -v '^$' > %t.printed
// RUN: diff -u %t.expected %t.printed
// RUN: tilefuse-opt %s | tilefuse-opt | grep -v '^$' | diff -u %t.expected -
// RUN: tilefuse-opt %s -canonicalize -fuse-hoist-broadcasts | grep -v '^$' | diff -u %t.expected -
//
// RMSNorm forward, "none" casting: x's dtype throughout, each step rounded
// to it as PyTorch's eager ops on x's dtype round it:
//   rstd = rsqrt(mean(x^2) + eps),  y = (x * rstd) * (offset + weight)
// The mean accumulates in f32, as PyTorch's does; the saved rstd is the
// rounded one the forward used.
module {
  fuse.kernel @rms_norm_none_fwd(%x: !fuse.full<f32>, %weight: !fuse.col<f32>, %eps: !fuse.scalar<f32>, %offset: !fuse.scalar<f32>) -> (y: !fuse.full<f32>, rstd: !fuse.row<f32>) {
    %0 = fuse.mul %x, %x : !fuse.full<f32>
    %1 = fuse.round_to_storage %0 of %x : !fuse.full<f32>, !fuse.full<f32>
    %2 = fuse.reduce mean %1 : !fuse.full<f32> to !fuse.row<f32>
    %3 = fuse.round_to_storage %2 of %x : !fuse.row<f32>, !fuse.full<f32>
    %4 = fuse.broadcast %eps : !fuse.scalar<f32> to !fuse.row<f32>
    %5 = fuse.add %3, %4 : !fuse.row<f32>
    %6 = fuse.round_to_storage %5 of %x : !fuse.row<f32>, !fuse.full<f32>
    %7 = fuse.rsqrt %6 : !fuse.row<f32>
    %8 = fuse.round_to_storage %7 of %x : !fuse.row<f32>, !fuse.full<f32>
    %9 = fuse.broadcast %8 : !fuse.row<f32> to !fuse.full<f32>
    %10 = fuse.mul %x, %9 : !fuse.full<f32>
    %11 = fuse.round_to_storage %10 of %x : !fuse.full<f32>, !fuse.full<f32>
    %12 = fuse.broadcast %offset : !fuse.scalar<f32> to !fuse.col<f32>
    %13 = fuse.add %12, %weight : !fuse.col<f32>
    %14 = fuse.round_to_storage %13 of %x : !fuse.col<f32>, !fuse.full<f32>
    %15 = fuse.broadcast %14 : !fuse.col<f32> to !fuse.full<f32>
    %16 = fuse.mul %11, %15 : !fuse.full<f32>
    fuse.yield %16, %8 : !fuse.full<f32>, !fuse.row<f32>
  }
}
