// f64: a row reduction computed in f64 crosses warps through f64 shared
// memory (f32 slots would round it) and 64-bit shuffles, and f64 storage
// of a fusion that computes in f32 widens its column-reduction results
// (fpext, not truncf).
//
// RUN: tilefuse-compile %S/Inputs/sum_sq_f64.mlir --dtype=f64 --n=4096 --target=sm_90 -o %t.sum_sq.ptx
// RUN: %ptxas-check sm_90 %t.sum_sq.ptx
// RUN: FileCheck %s --check-prefix=SHARED < %t.sum_sq.ptx
// RUN: tilefuse-compile %S/../fusions/rms_norm_bwd.mlir --dtype=f64 --n=4096 --target=sm_90 -o %t.bwd.ptx
// RUN: %ptxas-check sm_90 %t.bwd.ptx
// RUN: FileCheck %s --check-prefix=WIDEN < %t.bwd.ptx
// RUN: tilefuse-compile %S/../fusions/rms_norm_bwd.mlir --dtype=f64 --n=64 --target=cpu --emit=llvm | FileCheck %s --check-prefix=CPU

// SHARED: .shared .align 8 .b8 __wg_sum_sq_0[64];
// SHARED: st.shared.b64
// SHARED: bar.sync
// SHARED-NEXT: ld.shared.b64 %[[WARP:rd[0-9]+]],
// SHARED-NEXT: cvt.u32.u64 %[[LOW:r[0-9]+]], %[[WARP]];
// SHARED-NEXT: mov.b64 {_, %[[HIGH:r[0-9]+]]}, %[[WARP]];
// SHARED-NEXT: shfl.sync.bfly.b32 %r{{[0-9]+}}, %[[LOW]], 1, 31, -1;
// SHARED-NEXT: shfl.sync.bfly.b32 %r{{[0-9]+}}, %[[HIGH]], 1, 31, -1;

// WIDEN-LABEL: .entry rms_norm_bwd_finalize(
// WIDEN: cvt.f64.f32 %[[WIDE:rd[0-9]+]], %r{{[0-9]+}};
// WIDEN: st.global.b64 [%rd{{[0-9]+}}], %[[WIDE]];

// CPU-LABEL: define void @rms_norm_bwd_finalize(
// CPU: fpext float %{{.+}} to double
