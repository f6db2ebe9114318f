// RUN: grep -v -e '^ *//' -e '^$' %s > %t.expected
// RUN: tilefuse-opt %s | grep -v '^$' > %t.printed
// RUN: diff -u %t.expected %t.printed
// RUN: tilefuse-opt %s | tilefuse-opt | grep -v '^$' | diff -u %t.expected -
// RUN: tilefuse-opt %s -canonicalize -fuse-hoist-broadcasts | grep -v '^$' | diff -u %t.expected -
//
// SwiGLU forward (LLaMA MLP gate): c = silu(a) * b,  silu(a) = a * sigmoid(a)
module {
  fuse.kernel @swiglu_fwd(%a: !fuse.full<f32>, %b: !fuse.full<f32>) -> (c: !fuse.full<f32>) {
    %0 = fuse.sigmoid %a : !fuse.full<f32>
    %1 = fuse.mul %a, %0 : !fuse.full<f32>
    %2 = fuse.mul %1, %b : !fuse.full<f32>
    fuse.yield %2 : !fuse.full<f32>
  }
}
