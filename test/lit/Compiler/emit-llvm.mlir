// The LLVM IR stage of each target, after optimization.
// RUN: tilefuse-compile %S/../fusions/rms_norm_fwd.mlir --dtype=bf16 --n=4096 --target=sm_90 --emit=llvm | FileCheck %s --check-prefix=GPU
// RUN: tilefuse-compile %S/../fusions/rms_norm_fwd.mlir --dtype=f32 --n=4096 --target=cpu --emit=llvm | FileCheck %s --check-prefix=CPU

// GPU: define ptx_kernel void @rms_norm_fwd(ptr addrspace(1) {{.*}}, ptr addrspace(1) {{.*}}, float {{.*}}, ptr addrspace(1) {{.*}}, ptr addrspace(1) {{.*}}, i64 {{.*}})
// GPU: load <8 x bfloat>, ptr addrspace(1) {{.*}}, align 16
// GPU: call float @llvm.nvvm.shfl.sync.bfly.f32(i32 -1, float {{.*}}, i32 1, i32 31)
// GPU: call void @llvm.nvvm.barrier
// libdevice is linked and inlined: no call to it remains.
// GPU-NOT: call {{.*}}@__nv_

// CPU: define void @rms_norm_fwd(ptr {{.*}}, ptr {{.*}}, float {{.*}}, ptr {{.*}}, ptr {{.*}}, i64 {{.*}}, i64 {{.*}}, i64 {{.*}}, i64 {{.*}})
// CPU: load <8 x float>, ptr {{.*}}, align 16
// CPU: store <8 x float> {{.*}}, ptr {{.*}}, align 16
