// RUN: grep -v -e '^ *//' -e '^$' %s > %t.expected
// RUN: tilefuse-opt %s | grep -v '^$' > %t.printed
// RUN: diff -u %t.expected %t.printed
// RUN: tilefuse-opt %s | tilefuse-opt | grep -v '^$' | diff -u %t.expected -
// RUN: tilefuse-opt %s -canonicalize -fuse-hoist-broadcasts | grep -v '^$' | diff -u %t.expected -
//
// GeGLU forward (gelu approximate='tanh', Gemma's "gelu_pytorch_tanh"):
//   c = 0.5 * a * (1 + tanh(sqrt(2/pi) * (a + 0.044715 a^3))) * b
module {
  fuse.kernel @geglu_tanh_fwd(%a: !fuse.full<f32>, %b: !fuse.full<f32>) -> (c: !fuse.full<f32>) {
    %0 = fuse.constant full 5.000000e-01 : f32
    %1 = fuse.constant full 1.000000e+00 : f32
    %2 = fuse.constant full 0.797884583 : f32
    %3 = fuse.constant full 4.471500e-02 : f32
    %4 = fuse.mul %a, %3 : !fuse.full<f32>
    %5 = fuse.mul %4, %a : !fuse.full<f32>
    %6 = fuse.mul %5, %a : !fuse.full<f32>
    %7 = fuse.add %a, %6 : !fuse.full<f32>
    %8 = fuse.mul %7, %2 : !fuse.full<f32>
    %9 = fuse.tanh %8 : !fuse.full<f32>
    %10 = fuse.add %9, %1 : !fuse.full<f32>
    %11 = fuse.mul %a, %0 : !fuse.full<f32>
    %12 = fuse.mul %11, %10 : !fuse.full<f32>
    %13 = fuse.mul %12, %b : !fuse.full<f32>
    fuse.yield %13 : !fuse.full<f32>
  }
}
