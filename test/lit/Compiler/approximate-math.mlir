// fuse-approximate-math: f32 exp, tanh and erf become arithmetic on the
// vectors the CPU row program computes (no libm call per element); log
// (whose polynomial clamps subnormal inputs) and f64 math are left alone.
// RUN: tilefuse-opt %s --fuse-approximate-math | FileCheck %s
// RUN: tilefuse-compile %S/Inputs/tanh_erf.mlir --dtype=f32 --n=64 --target=cpu --emit=llvm | FileCheck %s --check-prefix=LLVM
// RUN: tilefuse-compile %S/../fusions/swiglu_fwd.mlir --dtype=f32 --n=64 --target=cpu --emit=llvm | FileCheck %s --check-prefix=EXP

// CHECK-LABEL: func.func @approximated
// CHECK-NOT: math.tanh
// CHECK-NOT: math.erf
// CHECK: math.fma
// CHECK-NOT: math.exp
// CHECK: return
func.func @approximated(%x: f32, %v: vector<4xf32>) -> (f32, vector<4xf32>, vector<4xf32>) {
  %0 = math.tanh %x : f32
  %1 = math.erf %v : vector<4xf32>
  %2 = math.exp %v : vector<4xf32>
  return %0, %1, %2 : f32, vector<4xf32>, vector<4xf32>
}

// CHECK-LABEL: func.func @kept
// CHECK: math.tanh %{{.+}} : vector<2xf64>
// CHECK: math.sqrt %{{.+}} : vector<4xf32>
// CHECK: math.log %{{.+}} : vector<4xf32>
func.func @kept(%x: vector<4xf32>, %y: vector<2xf64>) -> (vector<2xf64>, vector<4xf32>, vector<4xf32>) {
  %0 = math.tanh %y : vector<2xf64>
  %1 = math.sqrt %x : vector<4xf32>
  %2 = math.log %x : vector<4xf32>
  return %0, %1, %2 : vector<2xf64>, vector<4xf32>, vector<4xf32>
}

// The CPU pipeline runs it: no tanh, erf or exp call is left.
// LLVM-LABEL: define void @tanh_erf(
// LLVM-NOT: call {{.*}}tanh
// LLVM-NOT: call {{.*}}erf
// LLVM: ret void
// EXP-LABEL: define void @swiglu_fwd(
// EXP-NOT: @llvm.exp
// EXP: ret void
