// RUN: grep -v -e '^ *//' -e '^$' %s > %t.expected
// RUN: tilefuse-opt %s | grep -v '^$' > %t.printed
// RUN: diff -u %t.expected %t.printed
// RUN: tilefuse-opt %s | tilefuse-opt | grep -v '^$' | diff -u %t.expected -
// RUN: tilefuse-opt %s -canonicalize -fuse-hoist-broadcasts | grep -v '^$' | diff -u %t.expected -
//
// GeGLU backward (gelu approximate='tanh'), torch's gelu_backward with
// 0.5 (1 + t) = sigmoid(2u) and 1 - t^2 = sech^2(u), both accurate where
// t = tanh(u) saturates:
//   u = sqrt(2/pi) * (a + 0.044715 a^3),  s = sigmoid(2u),  e = exp(-2|u|)
//   gelu'(a) = s + 0.5 a * 4e / (1 + e)^2 * sqrt(2/pi) (1 + 3 * 0.044715 a^2)
//   da = dc * b * gelu'(a),  db = dc * a * s
module {
  fuse.kernel @geglu_tanh_bwd(%dc: !fuse.full<f32>, %a: !fuse.full<f32>, %b: !fuse.full<f32>) -> (da: !fuse.full<f32>, db: !fuse.full<f32>) {
    %0 = fuse.constant full 5.000000e-01 : f32
    %1 = fuse.constant full 1.341450e-01 : f32
    %2 = fuse.constant full 4.000000e+00 : f32
    %3 = fuse.constant full 1.000000e+00 : f32
    %4 = fuse.constant full -2.000000e+00 : f32
    %5 = fuse.constant full 2.000000e+00 : f32
    %6 = fuse.constant full 0.797884583 : f32
    %7 = fuse.constant full 4.471500e-02 : f32
    %8 = fuse.mul %a, %a : !fuse.full<f32>
    %9 = fuse.mul %8, %a : !fuse.full<f32>
    %10 = fuse.mul %9, %7 : !fuse.full<f32>
    %11 = fuse.add %a, %10 : !fuse.full<f32>
    %12 = fuse.mul %11, %6 : !fuse.full<f32>
    %13 = fuse.mul %12, %5 : !fuse.full<f32>
    %14 = fuse.sigmoid %13 : !fuse.full<f32>
    %15 = fuse.abs %12 : !fuse.full<f32>
    %16 = fuse.mul %15, %4 : !fuse.full<f32>
    %17 = fuse.exp %16 : !fuse.full<f32>
    %18 = fuse.add %17, %3 : !fuse.full<f32>
    %19 = fuse.mul %18, %18 : !fuse.full<f32>
    %20 = fuse.mul %17, %2 : !fuse.full<f32>
    %21 = fuse.div %20, %19 : !fuse.full<f32>
    %22 = fuse.mul %8, %1 : !fuse.full<f32>
    %23 = fuse.add %22, %3 : !fuse.full<f32>
    %24 = fuse.mul %23, %6 : !fuse.full<f32>
    %25 = fuse.mul %a, %0 : !fuse.full<f32>
    %26 = fuse.mul %25, %21 : !fuse.full<f32>
    %27 = fuse.mul %26, %24 : !fuse.full<f32>
    %28 = fuse.add %14, %27 : !fuse.full<f32>
    %29 = fuse.mul %dc, %b : !fuse.full<f32>
    %30 = fuse.mul %29, %28 : !fuse.full<f32>
    %31 = fuse.mul %a, %14 : !fuse.full<f32>
    %32 = fuse.mul %dc, %31 : !fuse.full<f32>
    fuse.yield %30, %32 : !fuse.full<f32>, !fuse.full<f32>
  }
}
