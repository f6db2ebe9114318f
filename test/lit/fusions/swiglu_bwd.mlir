// RUN: grep -v -e '^ *//' -e '^$' %s > %t.expected
// RUN: tilefuse-opt %s | grep -v '^$' > %t.printed
// RUN: diff -u %t.expected %t.printed
// RUN: tilefuse-opt %s | tilefuse-opt | grep -v '^$' | diff -u %t.expected -
// RUN: tilefuse-opt %s -canonicalize -fuse-hoist-broadcasts | grep -v '^$' | diff -u %t.expected -
//
// SwiGLU backward, recomputing sigmoid(a) instead of saving it:
//   db = dc * silu(a)
//   da = dc * b * sigmoid(a) * (1 + a * (1 - sigmoid(a)))
module {
  fuse.kernel @swiglu_bwd(%dc: !fuse.full<f32>, %a: !fuse.full<f32>, %b: !fuse.full<f32>) -> (da: !fuse.full<f32>, db: !fuse.full<f32>) {
    %0 = fuse.constant full 1.000000e+00 : f32
    %1 = fuse.sigmoid %a : !fuse.full<f32>
    %2 = fuse.mul %a, %1 : !fuse.full<f32>
    %3 = fuse.mul %dc, %2 : !fuse.full<f32>
    %4 = fuse.sub %0, %1 : !fuse.full<f32>
    %5 = fuse.mul %a, %4 : !fuse.full<f32>
    %6 = fuse.add %5, %0 : !fuse.full<f32>
    %7 = fuse.mul %1, %6 : !fuse.full<f32>
    %8 = fuse.mul %dc, %b : !fuse.full<f32>
    %9 = fuse.mul %8, %7 : !fuse.full<f32>
    fuse.yield %9, %3 : !fuse.full<f32>, !fuse.full<f32>
  }
}
