// fuse-approximate-math: f32 tanh and erf become arithmetic (no libm call);
// exp stays with libm, and f64 math is left alone.
// RUN: tilefuse-opt %s --fuse-approximate-math | FileCheck %s
// RUN: tilefuse-compile %S/Inputs/tanh_erf.mlir --dtype=f32 --n=64 --target=cpu --emit=llvm | FileCheck %s --check-prefix=LLVM
// RUN: tilefuse-compile %S/../fusions/swiglu_fwd.mlir --dtype=f32 --n=64 --target=cpu --emit=llvm | FileCheck %s --check-prefix=EXP

// CHECK-LABEL: func.func @approximated
// CHECK-NOT: math.tanh
// CHECK-NOT: math.erf
// CHECK: math.fma
// CHECK: return
func.func @approximated(%x: f32, %v: vector<4xf32>) -> (f32, vector<4xf32>) {
  %0 = math.tanh %x : f32
  %1 = math.erf %v : vector<4xf32>
  return %0, %1 : f32, vector<4xf32>
}

// CHECK-LABEL: func.func @kept
// CHECK: math.exp %{{.+}} : f32
// CHECK: math.tanh %{{.+}} : f64
func.func @kept(%x: f32, %y: f64) -> (f32, f64) {
  %0 = math.exp %x : f32
  %1 = math.tanh %y : f64
  return %0, %1 : f32, f64
}

// The CPU pipeline runs it: no tanh or erf call is left; silu's exp is still
// one libm call per element.
// LLVM-LABEL: define void @tanh_erf(
// LLVM-NOT: call {{.*}}tanh
// LLVM-NOT: call {{.*}}erf
// LLVM: ret void
// EXP: call float @llvm.exp.f32
