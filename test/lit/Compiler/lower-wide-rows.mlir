// RUN: tilefuse-opt %s -split-input-file --pass-pipeline='builtin.module(fuse.kernel(fuse-specialize{dtype=bf16 n=32000}, fuse-select-tiles{target=sm_90}, fuse-merge-reductions), fuse-lower-to-gpu, canonicalize, cse)' | FileCheck %s
// At n = 8192 a thread keeps 32 elements (256 threads x 4 chunks x 8): not
// a wide row.
// RUN: tilefuse-opt %s -split-input-file --pass-pipeline='builtin.module(fuse.kernel(fuse-specialize{dtype=bf16 n=8192}, fuse-select-tiles{target=sm_90}, fuse-merge-reductions), fuse-lower-to-gpu, canonicalize, cse)' | FileCheck %s --check-prefix=NARROW

// A wide row on chip (bf16 n = 32000: 8 chunks of 8 elements a thread, 64
// kept) whose per-element values are cheap: the second pass copies each
// chunk's packed loads (4 words of 2 bf16) through an opaque mov.b32 and
// widens them again, so the first pass's f32 values die with it.
// CHECK-LABEL: gpu.func @rms
// CHECK-COUNT-8: llvm.load %{{.+}} {alignment = 16 : i64} : !llvm.ptr<1> -> vector<8xbf16>
// CHECK: gpu.barrier
// CHECK: gpu.barrier
// CHECK-COUNT-32: llvm.inline_asm has_side_effects asm_dialect = att "mov.b32 $0, $1;", "=r,r"
// CHECK-NOT: llvm.inline_asm
// CHECK: arith.extf %{{.+}} : vector<8xbf16> to vector<8xf32>
// CHECK: gpu.return
// NARROW-LABEL: gpu.func @rms
// NARROW-NOT: mov.b32
// NARROW: gpu.return
fuse.kernel @rms(%x: !fuse.full<f32>, %eps: !fuse.scalar<f32>) -> (y: !fuse.full<f32>) {
  %sq = fuse.mul %x, %x : !fuse.full<f32>
  %ms = fuse.reduce mean %sq : !fuse.full<f32> to !fuse.row<f32>
  %eps_r = fuse.broadcast %eps : !fuse.scalar<f32> to !fuse.row<f32>
  %v = fuse.add %ms, %eps_r : !fuse.row<f32>
  %r = fuse.rsqrt %v : !fuse.row<f32>
  %r_f = fuse.broadcast %r : !fuse.row<f32> to !fuse.full<f32>
  %y = fuse.mul %x, %r_f : !fuse.full<f32>
  fuse.yield %y : !fuse.full<f32>
}

// -----

// What only the last pass computes is never held: a transcendental there
// (a sigmoid of the output) leaves the loads packed.
// CHECK-LABEL: gpu.func @rms_sigmoid
// CHECK: gpu.barrier
// CHECK: gpu.barrier
// CHECK-COUNT-32: llvm.inline_asm has_side_effects asm_dialect = att "mov.b32 $0, $1;", "=r,r"
// CHECK: math.exp
// CHECK: gpu.return
fuse.kernel @rms_sigmoid(%x: !fuse.full<f32>, %eps: !fuse.scalar<f32>) -> (y: !fuse.full<f32>) {
  %sq = fuse.mul %x, %x : !fuse.full<f32>
  %ms = fuse.reduce mean %sq : !fuse.full<f32> to !fuse.row<f32>
  %eps_r = fuse.broadcast %eps : !fuse.scalar<f32> to !fuse.row<f32>
  %v = fuse.add %ms, %eps_r : !fuse.row<f32>
  %r = fuse.rsqrt %v : !fuse.row<f32>
  %r_f = fuse.broadcast %r : !fuse.row<f32> to !fuse.full<f32>
  %n = fuse.mul %x, %r_f : !fuse.full<f32>
  %y = fuse.sigmoid %n : !fuse.full<f32>
  fuse.yield %y : !fuse.full<f32>
}

// -----

// Softmax holds exp(x - max) from its second pass for its outputs:
// recomputing the values around it would free no register. Its passes reuse
// what the earlier ones computed.
// CHECK-LABEL: gpu.func @softmax
// CHECK-NOT: mov.b32
// CHECK: gpu.return
fuse.kernel @softmax(%x: !fuse.full<f32>) -> (y: !fuse.full<f32>) {
  %max = fuse.reduce max %x : !fuse.full<f32> to !fuse.row<f32>
  %max_f = fuse.broadcast %max : !fuse.row<f32> to !fuse.full<f32>
  %shifted = fuse.sub %x, %max_f : !fuse.full<f32>
  %e = fuse.exp %shifted : !fuse.full<f32>
  %sum = fuse.reduce sum %e : !fuse.full<f32> to !fuse.row<f32>
  %sum_f = fuse.broadcast %sum : !fuse.row<f32> to !fuse.full<f32>
  %y = fuse.div %e, %sum_f : !fuse.full<f32>
  fuse.yield %y : !fuse.full<f32>
}

// -----

// A column mask (iota < k) derives from the chunk's first column, not from
// a load: the base is copied as well (an index through one mov.b32 per
// chunk, before its 4 words), so the later pass recomputes the masks
// instead of holding them (12 bytes of spill at 128 registers before).
// CHECK-LABEL: gpu.func @masked_rms
// CHECK: gpu.barrier
// CHECK: gpu.barrier
// CHECK-COUNT-40: llvm.inline_asm has_side_effects asm_dialect = att "mov.b32 $0, $1;", "=r,r"
// CHECK-NOT: llvm.inline_asm
// CHECK: gpu.return
fuse.kernel @masked_rms(%x: !fuse.full<f32>, %k: !fuse.scalar<i64>, %eps: !fuse.scalar<f32>) -> (y: !fuse.full<f32>) {
  %col = fuse.iota : !fuse.col<i64>
  %k_c = fuse.broadcast %k : !fuse.scalar<i64> to !fuse.col<i64>
  %in = fuse.cmp lt, %col, %k_c : !fuse.col<i64>
  %in_f = fuse.broadcast %in : !fuse.col<i1> to !fuse.full<i1>
  %zero = fuse.constant scalar 0.0 : f32
  %zero_f = fuse.broadcast %zero : !fuse.scalar<f32> to !fuse.full<f32>
  %xm = fuse.select %in_f, %x, %zero_f : !fuse.full<f32>
  %sq = fuse.mul %xm, %xm : !fuse.full<f32>
  %ms = fuse.reduce mean %sq : !fuse.full<f32> to !fuse.row<f32>
  %eps_r = fuse.broadcast %eps : !fuse.scalar<f32> to !fuse.row<f32>
  %v = fuse.add %ms, %eps_r : !fuse.row<f32>
  %r = fuse.rsqrt %v : !fuse.row<f32>
  %r_f = fuse.broadcast %r : !fuse.row<f32> to !fuse.full<f32>
  %y = fuse.mul %xm, %r_f : !fuse.full<f32>
  fuse.yield %y : !fuse.full<f32>
}
