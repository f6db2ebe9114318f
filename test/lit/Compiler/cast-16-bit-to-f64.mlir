// A 16-bit float widens to f64 through f32 (exact either way). On the CPU
// bf16 -> f32 becomes integer operations (arith-expand); a direct bf16 ->
// f64 left LLVM a bf16 value to compare in, and its lowering called
// __truncsfbf2, which the JIT does not have.
// RUN: tilefuse-compile %s --dtype=bf16 --n=64 --target=cpu --emit=llvm | FileCheck %s --check-prefix=CPU
// RUN: tilefuse-compile %s --dtype=bf16 --n=64 --target=sm_90 -o %t.ptx
// RUN: %ptxas-check sm_90 %t.ptx

// CPU: shl <8 x i32> %{{.+}}, splat (i32 16)
// CPU: fpext <8 x float> %{{.+}} to <8 x double>
// CPU-NOT: fpext <8 x bfloat>
// CPU-NOT: __truncsfbf2
module {
  fuse.kernel @k(%x: !fuse.full<bf16>, %y: !fuse.full<f64>) -> (z: !fuse.full<f64>) {
    %0 = fuse.cast %x : !fuse.full<bf16> to !fuse.full<f64>
    %1 = fuse.maximum %0, %y : !fuse.full<f64>
    fuse.yield %1 : !fuse.full<f64>
  }
}
