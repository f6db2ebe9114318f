// RUN: grep -v -e '^ *//' -e '^$' %s > %t.expected
// RUN: tilefuse-opt %s | grep -v '^$' > %t.printed
// RUN: diff -u %t.expected %t.printed
// RUN: tilefuse-opt %s | tilefuse-opt | grep -v '^$' | diff -u %t.expected -
// RUN: tilefuse-opt %s -canonicalize -fuse-hoist-broadcasts | grep -v '^$' | diff -u %t.expected -
//
// RMSNorm forward, "llama" casting (HF LlamaRMSNorm):
//   y = (x * rstd).to(x.dtype) * (offset + weight)
// the normalized x is rounded to x's storage dtype before the weight
// multiplies it; y is stored in the promoted dtype of x and weight.
module {
  fuse.kernel @rms_norm_llama_fwd(%x: !fuse.full<f32>, %weight: !fuse.col<f32>, %eps: !fuse.scalar<f32>, %offset: !fuse.scalar<f32>) -> (y: !fuse.full<f32>, rstd: !fuse.row<f32>) {
    %0 = fuse.mul %x, %x : !fuse.full<f32>
    %1 = fuse.reduce mean %0 : !fuse.full<f32> to !fuse.row<f32>
    %2 = fuse.broadcast %eps : !fuse.scalar<f32> to !fuse.row<f32>
    %3 = fuse.add %1, %2 : !fuse.row<f32>
    %4 = fuse.rsqrt %3 : !fuse.row<f32>
    %5 = fuse.broadcast %4 : !fuse.row<f32> to !fuse.full<f32>
    %6 = fuse.mul %x, %5 : !fuse.full<f32>
    %7 = fuse.round_to_storage %6 of %x : !fuse.full<f32>, !fuse.full<f32>
    %8 = fuse.broadcast %offset : !fuse.scalar<f32> to !fuse.col<f32>
    %9 = fuse.add %8, %weight : !fuse.col<f32>
    %10 = fuse.broadcast %9 : !fuse.col<f32> to !fuse.full<f32>
    %11 = fuse.mul %7, %10 : !fuse.full<f32>
    fuse.yield %11, %4 : !fuse.full<f32>, !fuse.row<f32>
  }
}
