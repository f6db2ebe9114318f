// f64: a row reduction computed in f64 crosses warps through f64 shared
// memory (f32 slots would round it), and f64 storage of a fusion that
// computes in f32 widens its column-reduction results (fpext, not truncf).
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
// SHARED: ld.shared.v2.b64

// WIDEN-LABEL: .entry rms_norm_bwd_finalize(
// WIDEN: cvt.f64.f32 %[[WIDE:rd[0-9]+]], %r{{[0-9]+}};
// WIDEN: st.global.b64 [%rd{{[0-9]+}}], %[[WIDE]];

// CPU-LABEL: define void @rms_norm_bwd_finalize(
// CPU: fpext float %{{.+}} to double
