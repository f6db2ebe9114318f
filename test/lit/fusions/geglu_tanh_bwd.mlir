// RUN: grep -v -e '^ *//' -e '^$' %s > %t.expected
// RUN: tilefuse-opt %s | grep -v '^$' > %t.printed
// RUN: diff -u %t.expected %t.printed
// RUN: tilefuse-opt %s | tilefuse-opt | grep -v '^$' | diff -u %t.expected -
// RUN: tilefuse-opt %s -canonicalize -fuse-hoist-broadcasts | grep -v '^$' | diff -u %t.expected -
//
// GeGLU backward (gelu approximate='tanh'), as torch's gelu_backward:
//   t = tanh(sqrt(2/pi) * (a + 0.044715 a^3))
//   gelu'(a) = 0.5 (1 + t) + 0.5 a (1 - t^2) sqrt(2/pi) (1 + 3 * 0.044715 a^2)
//   da = dc * b * gelu'(a),  db = dc * 0.5 a (1 + t)
module {
  fuse.kernel @geglu_tanh_bwd(%dc: !fuse.full<f32>, %a: !fuse.full<f32>, %b: !fuse.full<f32>) -> (da: !fuse.full<f32>, db: !fuse.full<f32>) {
    %0 = fuse.constant full 1.341450e-01 : f32
    %1 = fuse.constant full 1.000000e+00 : f32
    %2 = fuse.constant full 5.000000e-01 : f32
    %3 = fuse.constant full 0.797884583 : f32
    %4 = fuse.constant full 4.471500e-02 : f32
    %5 = fuse.mul %a, %a : !fuse.full<f32>
    %6 = fuse.mul %5, %a : !fuse.full<f32>
    %7 = fuse.mul %6, %4 : !fuse.full<f32>
    %8 = fuse.add %a, %7 : !fuse.full<f32>
    %9 = fuse.mul %8, %3 : !fuse.full<f32>
    %10 = fuse.tanh %9 : !fuse.full<f32>
    %11 = fuse.mul %a, %2 : !fuse.full<f32>
    %12 = fuse.add %10, %1 : !fuse.full<f32>
    %13 = fuse.mul %5, %0 : !fuse.full<f32>
    %14 = fuse.add %13, %1 : !fuse.full<f32>
    %15 = fuse.mul %14, %3 : !fuse.full<f32>
    %16 = fuse.mul %10, %10 : !fuse.full<f32>
    %17 = fuse.sub %1, %16 : !fuse.full<f32>
    %18 = fuse.mul %11, %17 : !fuse.full<f32>
    %19 = fuse.mul %18, %15 : !fuse.full<f32>
    %20 = fuse.mul %12, %2 : !fuse.full<f32>
    %21 = fuse.add %20, %19 : !fuse.full<f32>
    %22 = fuse.mul %dc, %b : !fuse.full<f32>
    %23 = fuse.mul %22, %21 : !fuse.full<f32>
    %24 = fuse.mul %11, %12 : !fuse.full<f32>
    %25 = fuse.mul %dc, %24 : !fuse.full<f32>
    fuse.yield %23, %25 : !fuse.full<f32>, !fuse.full<f32>
  }
}
