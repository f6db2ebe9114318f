// RUN: grep -v -e '^ *//' -e '^$' %s > %t.expected
// RUN: tilefuse-opt %s | grep -v '^$' > %t.printed
// RUN: diff -u %t.expected %t.printed
// RUN: tilefuse-opt %s | tilefuse-opt | grep -v '^$' | diff -u %t.expected -
// RUN: tilefuse-opt %s -canonicalize -fuse-hoist-broadcasts | grep -v '^$' | diff -u %t.expected -
//
// GeGLU forward (gelu approximate='tanh', Gemma's "gelu_pytorch_tanh"):
//   c = 0.5 a (1 + tanh(u)) * b = a * sigmoid(2u) * b,
//   u = sqrt(2/pi) * (a + 0.044715 a^3)
// (the sigmoid form does not cancel where tanh saturates at -1).
module {
  fuse.kernel @geglu_tanh_fwd(%a: !fuse.full<f32>, %b: !fuse.full<f32>) -> (c: !fuse.full<f32>) {
    %0 = fuse.constant full 2.000000e+00 : f32
    %1 = fuse.constant full 0.797884583 : f32
    %2 = fuse.constant full 4.471500e-02 : f32
    %3 = fuse.mul %a, %a : !fuse.full<f32>
    %4 = fuse.mul %3, %a : !fuse.full<f32>
    %5 = fuse.mul %4, %2 : !fuse.full<f32>
    %6 = fuse.add %a, %5 : !fuse.full<f32>
    %7 = fuse.mul %6, %1 : !fuse.full<f32>
    %8 = fuse.mul %7, %0 : !fuse.full<f32>
    %9 = fuse.sigmoid %8 : !fuse.full<f32>
    %10 = fuse.mul %a, %9 : !fuse.full<f32>
    %11 = fuse.mul %10, %b : !fuse.full<f32>
    fuse.yield %11 : !fuse.full<f32>
  }
}
