// RUN: grep -v -e '^ *//' -e '^$' %s > %t.expected
// RUN: tilefuse-opt %s | grep -v '^$' > %t.printed
// RUN: diff -u %t.expected %t.printed
// RUN: tilefuse-opt %s | tilefuse-opt | grep -v '^$' | diff -u %t.expected -
// RUN: tilefuse-opt %s -canonicalize -fuse-hoist-broadcasts | grep -v '^$' | diff -u %t.expected -
//
// GeGLU backward (exact gelu), as torch's gelu_backward writes it:
//   cdf = 0.5 * (1 + erf(a / sqrt(2))),  pdf = exp(-a^2 / 2) / sqrt(2 pi)
//   da = dc * b * (cdf + a * pdf),  db = dc * a * cdf
module {
  fuse.kernel @geglu_bwd(%dc: !fuse.full<f32>, %a: !fuse.full<f32>, %b: !fuse.full<f32>) -> (da: !fuse.full<f32>, db: !fuse.full<f32>) {
    %0 = fuse.constant full 0.398942292 : f32
    %1 = fuse.constant full -5.000000e-01 : f32
    %2 = fuse.constant full 5.000000e-01 : f32
    %3 = fuse.constant full 1.000000e+00 : f32
    %4 = fuse.constant full 0.707106769 : f32
    %5 = fuse.mul %a, %4 : !fuse.full<f32>
    %6 = fuse.erf %5 : !fuse.full<f32>
    %7 = fuse.add %6, %3 : !fuse.full<f32>
    %8 = fuse.mul %7, %2 : !fuse.full<f32>
    %9 = fuse.mul %a, %a : !fuse.full<f32>
    %10 = fuse.mul %9, %1 : !fuse.full<f32>
    %11 = fuse.exp %10 : !fuse.full<f32>
    %12 = fuse.mul %11, %0 : !fuse.full<f32>
    %13 = fuse.mul %a, %12 : !fuse.full<f32>
    %14 = fuse.add %8, %13 : !fuse.full<f32>
    %15 = fuse.mul %dc, %b : !fuse.full<f32>
    %16 = fuse.mul %15, %14 : !fuse.full<f32>
    %17 = fuse.mul %a, %8 : !fuse.full<f32>
    %18 = fuse.mul %dc, %17 : !fuse.full<f32>
    fuse.yield %16, %18 : !fuse.full<f32>, !fuse.full<f32>
  }
}
