// RUN: grep -v -e '^ *//' -e '^$' %s > %t.expected
// RUN: tilefuse-opt %s | grep -v '^$' > %t.printed
// RUN: diff -u %t.expected %t.printed
// RUN: tilefuse-opt %s | tilefuse-opt | grep -v '^$' | diff -u %t.expected -
// RUN: tilefuse-opt %s -canonicalize -fuse-hoist-broadcasts | grep -v '^$' | diff -u %t.expected -
//
// GeGLU forward (exact gelu): c = gelu(a) * b,
//   gelu(a) = 0.5 * a * (1 + erf(a / sqrt(2)))
module {
  fuse.kernel @geglu_fwd(%a: !fuse.full<f32>, %b: !fuse.full<f32>) -> (c: !fuse.full<f32>) {
    %0 = fuse.constant full 5.000000e-01 : f32
    %1 = fuse.constant full 1.000000e+00 : f32
    %2 = fuse.constant full 0.707106769 : f32
    %3 = fuse.mul %a, %2 : !fuse.full<f32>
    %4 = fuse.erf %3 : !fuse.full<f32>
    %5 = fuse.add %4, %1 : !fuse.full<f32>
    %6 = fuse.mul %a, %0 : !fuse.full<f32>
    %7 = fuse.mul %6, %5 : !fuse.full<f32>
    %8 = fuse.mul %7, %b : !fuse.full<f32>
    fuse.yield %8 : !fuse.full<f32>
  }
}
