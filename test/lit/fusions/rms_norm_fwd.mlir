// RUN: grep -v -e '^ *//' -e '^$' %s > %t.expected
// RUN: tilefuse-opt %s | grep -v '^$' > %t.printed
// RUN: diff -u %t.expected %t.printed
// RUN: tilefuse-opt %s | tilefuse-opt | grep -v '^$' | diff -u %t.expected -
// RUN: tilefuse-opt %s -canonicalize -fuse-hoist-broadcasts | grep -v '^$' | diff -u %t.expected -
//
// RMSNorm forward, "gemma" casting (torch.nn.functional.rms_norm's own):
//   rstd = 1 / sqrt(mean(x^2) + eps),  y = x * rstd * (offset + weight)
// all in f32, rounded once to the storage dtype. offset is 0 for
// F.rms_norm, 1 for Gemma's zero-centered weights. rstd is saved for the
// backward pass.
module {
  fuse.kernel @rms_norm_fwd(%x: !fuse.full<f32>, %weight: !fuse.col<f32>, %eps: !fuse.scalar<f32>, %offset: !fuse.scalar<f32>) -> (y: !fuse.full<f32>, rstd: !fuse.row<f32>) {
    %0 = fuse.mul %x, %x : !fuse.full<f32>
    %1 = fuse.reduce mean %0 : !fuse.full<f32> to !fuse.row<f32>
    %2 = fuse.broadcast %eps : !fuse.scalar<f32> to !fuse.row<f32>
    %3 = fuse.add %1, %2 : !fuse.row<f32>
    %4 = fuse.rsqrt %3 : !fuse.row<f32>
    %5 = fuse.broadcast %4 : !fuse.row<f32> to !fuse.full<f32>
    %6 = fuse.mul %x, %5 : !fuse.full<f32>
    %7 = fuse.broadcast %offset : !fuse.scalar<f32> to !fuse.col<f32>
    %8 = fuse.add %7, %weight : !fuse.col<f32>
    %9 = fuse.broadcast %8 : !fuse.col<f32> to !fuse.full<f32>
    %10 = fuse.mul %6, %9 : !fuse.full<f32>
    fuse.yield %10, %4 : !fuse.full<f32>, !fuse.row<f32>
  }
}
