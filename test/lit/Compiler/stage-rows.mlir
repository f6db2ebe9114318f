// RUN: tilefuse-opt %s -split-input-file --pass-pipeline='builtin.module(fuse.kernel(fuse-specialize{dtype=f32 n=32000}, fuse-select-tiles{target=sm_90}, fuse-merge-reductions, fuse-stage-rows))' | FileCheck %s --check-prefix=F32
// RUN: tilefuse-opt %s -split-input-file --pass-pipeline='builtin.module(fuse.kernel(fuse-specialize{dtype=bf16 n=128256}, fuse-select-tiles{target=sm_90}, fuse-merge-reductions, fuse-stage-rows))' | FileCheck %s --check-prefix=BF16
// RUN: tilefuse-opt %s -split-input-file --pass-pipeline='builtin.module(fuse.kernel(fuse-specialize{dtype=f32 n=32000}, fuse-select-tiles{target=sm_86}, fuse-merge-reductions, fuse-stage-rows))' | FileCheck %s --check-prefix=SM86
// RUN: tilefuse-opt %s -split-input-file --pass-pipeline='builtin.module(fuse.kernel(fuse-specialize{dtype=f32 n=1024}, fuse-select-tiles{target=sm_90}, fuse-merge-reductions, fuse-stage-rows))' | FileCheck %s --check-prefix=ONCHIP
// RUN: tilefuse-opt %s -split-input-file --pass-pipeline='builtin.module(fuse.kernel(fuse-specialize{dtype=f32 n=1024}, fuse-select-tiles{target=sm_90 threads-per-row=64}, fuse-merge-reductions, fuse-stage-rows), fuse-lower-to-gpu, canonicalize, cse)' | FileCheck %s --check-prefix=PARTIALS
// RUN: tilefuse-opt %s -split-input-file --pass-pipeline='builtin.module(fuse.kernel(fuse-specialize{dtype=bf16 n=128256}, fuse-select-tiles{target=sm_90}, fuse-merge-reductions, fuse-stage-rows), fuse-lower-to-gpu, canonicalize, cse)' | FileCheck %s --check-prefix=SPLIT
// RUN: tilefuse-opt %s -split-input-file --pass-pipeline='builtin.module(fuse.kernel(fuse-specialize{dtype=f32 n=32000}, fuse-select-tiles{target=cpu}, fuse-merge-reductions, fuse-stage-rows))' | FileCheck %s --check-prefix=CPU
// RUN: tilefuse-opt %s -split-input-file --pass-pipeline='builtin.module(fuse.kernel(fuse-specialize{dtype=f32 n=32000}, fuse-select-tiles{target=sm_90}, fuse-merge-reductions, fuse-stage-rows), fuse-lower-to-gpu, canonicalize, cse)' | FileCheck %s --check-prefix=GPU
// The longest row the compiler takes (2^40: half a billion chunks per
// thread) stages as many chunks as fit, found without counting them down.
// RUN: tilefuse-opt %s -split-input-file --pass-pipeline='builtin.module(fuse.kernel(fuse-specialize{dtype=f32 n=1099511627776}, fuse-select-tiles{target=sm_90}, fuse-merge-reductions, fuse-stage-rows))' | FileCheck %s --check-prefix=HUGE
// Staging is a property of the tiled kernel: a second run chooses the same.
// RUN: tilefuse-opt %s -split-input-file --pass-pipeline='builtin.module(fuse.kernel(fuse-specialize{dtype=f32 n=32000}, fuse-select-tiles{target=sm_90}, fuse-merge-reductions, fuse-stage-rows, fuse-stage-rows))' | FileCheck %s --check-prefix=F32

// RMSNorm reads x twice (its mean square, then the output). f32 n = 32000
// on sm_90: 16 chunks of 512 threads x 4 lanes, all of them staged (128
// KiB); bf16 n = 128256: 28 of 32 chunks (224 KiB of the 227 KiB a block
// may opt into); sm_86 (99 KiB): 12 of 16.
// F32-LABEL: fuse.kernel @rms_norm
// HUGE-LABEL: fuse.kernel @rms_norm
// HUGE-SAME: chunks = 536870912 : i64, row_on_chip = false, rows_per_block = 1 : i64, stage_bytes = 229376 : i64, staged_chunks = 28 : i64
// F32-SAME: chunks = 16 : i64, row_on_chip = false, rows_per_block = 1 : i64, stage_bytes = 131072 : i64, staged_chunks = 16 : i64
// BF16-LABEL: fuse.kernel @rms_norm
// BF16-SAME: chunks = 32 : i64, row_on_chip = false, rows_per_block = 1 : i64, stage_bytes = 229376 : i64, staged_chunks = 28 : i64
// SM86-LABEL: fuse.kernel @rms_norm
// SM86-SAME: stage_bytes = 98304 : i64, staged_chunks = 12 : i64
// Lowered: the launch's dynamic shared memory; the first pass loads 8
// vectors of x per iteration (kStagedLoads), then stores them there; the
// second reads them back (a thread its own slots: no barrier) with the
// weight from global memory, 8 chunks an iteration (the whole row is
// staged and x is its one full input), all their loads before their
// stores.
// GPU: llvm.mlir.global external @tilefuse_stage() {addr_space = 3 : i32, alignment = 16 : i64} : !llvm.array<0 x i8>
// GPU-LABEL: gpu.func @rms_norm
// GPU: llvm.mlir.addressof @tilefuse_stage : !llvm.ptr<3>
// GPU: scf.for %{{.+}} = %c0 to %c2 step %c1 iter_args
// GPU-COUNT-8: llvm.load %{{.+}} {alignment = 16 : i64} : !llvm.ptr<1> -> vector<4xf32>
// GPU-NOT: llvm.store
// GPU-COUNT-8: llvm.store %{{.+}} {alignment = 16 : i64} : vector<4xf32>, !llvm.ptr<3>
// GPU: gpu.barrier
// GPU: scf.for %{{.+}} = %c0 to %c2 step %c1 {
// GPU-COUNT-8: llvm.load %{{.+}} {alignment = 16 : i64} : !llvm.ptr<3> -> vector<4xf32>
// GPU-NOT: llvm.store
// GPU-COUNT-8: llvm.store %{{.+}} {alignment = 16 : i64} : vector<4xf32>, !llvm.ptr<1>
// GPU-NOT: llvm.store %{{.+}} !llvm.ptr<3>
// GPU: gpu.return
// A row on chip stages nothing; nor does the CPU.
// ONCHIP-LABEL: fuse.kernel @rms_norm
// ONCHIP-NOT: stage
// CPU-NOT: stage
// CPU-NOT: partial
fuse.kernel @rms_norm(%x: !fuse.full<f32>, %weight: !fuse.col<f32>) -> (y: !fuse.full<f32>) {
  %sq = fuse.mul %x, %x : !fuse.full<f32>
  %ms = fuse.reduce mean %sq : !fuse.full<f32> to !fuse.row<f32>
  %r = fuse.rsqrt %ms : !fuse.row<f32>
  %rf = fuse.broadcast %r : !fuse.row<f32> to !fuse.full<f32>
  %w = fuse.broadcast %weight : !fuse.col<f32> to !fuse.full<f32>
  %xr = fuse.mul %x, %rf : !fuse.full<f32>
  %y = fuse.mul %xr, %w : !fuse.full<f32>
  fuse.yield %y : !fuse.full<f32>
}

// -----

// After fuse-merge-reductions a log-sum-exp reads its row once: nothing to
// stage.
// F32-LABEL: fuse.kernel @logsumexp
// F32-NOT: stage
// BF16-LABEL: fuse.kernel @logsumexp
// BF16-NOT: stage
fuse.kernel @logsumexp(%x: !fuse.full<f32>) -> (lse: !fuse.row<f32>) {
  %max = fuse.reduce max %x : !fuse.full<f32> to !fuse.row<f32>
  %max_f = fuse.broadcast %max : !fuse.row<f32> to !fuse.full<f32>
  %shifted = fuse.sub %x, %max_f : !fuse.full<f32>
  %e = fuse.exp %shifted : !fuse.full<f32>
  %sum = fuse.reduce sum %e : !fuse.full<f32> to !fuse.row<f32>
  %log = fuse.log %sum : !fuse.row<f32>
  %lse = fuse.add %max, %log : !fuse.row<f32>
  fuse.yield %lse : !fuse.row<f32>
}

// -----

// A norm's backward: its column partials (dw, read-modified-written for
// every row) stay on chip first, then dy and x, read in both passes, are
// staged. f32 n = 32000: the partials take 128 KiB, 6 of 16 chunks of dy
// and x the rest (16 KiB a chunk); bf16 n = 128256: the partials (512 KiB)
// do not fit, and 14 of their 32 chunks (16 KiB each) take the whole
// budget, dy and x none. n = 1024: the row stays in registers (one warp),
// the partials (8 rows of 4 KiB) in shared memory.
// F32-LABEL: fuse.kernel @norm_bwd
// F32-SAME: partial_chunks = 16 : i64, row_on_chip = false, rows_per_block = 1 : i64, stage_bytes = 229376 : i64, staged_chunks = 6 : i64
// BF16-LABEL: fuse.kernel @norm_bwd
// BF16-SAME: chunks = 32 : i64, partial_chunks = 14 : i64, row_on_chip = false, rows_per_block = 1 : i64, stage_bytes = 229376 : i64, staged_chunks = 0 : i64
// ONCHIP-LABEL: fuse.kernel @norm_bwd
// ONCHIP-SAME: chunks = 8 : i64, partial_chunks = 8 : i64, row_on_chip = true, rows_per_block = 8 : i64, stage_bytes = 32768 : i64, staged_chunks = 0 : i64
// Lowered where only 14 of 32 chunks of partials fit (bf16 n = 128256):
// those start as the identity in shared memory, the rest in the block's
// row of the global partials; the final pass adds to the first 14 chunks'
// in shared memory (groups of 2 chunks), to the other 18 chunks' in global
// memory (groups of 4, the last 2 one at a time);
// after the last row the 14 chunks are written to the global row once.
// SPLIT-LABEL: gpu.func @norm_bwd
// SPLIT: scf.for %{{.+}} = %c0 to %c14 step %c1 {
// SPLIT: llvm.store %{{.+}} {alignment = 16 : i64} : vector<8xf32>, !llvm.ptr<3>
// SPLIT: scf.for %{{.+}} = %c14 to %c32 step %c1 {
// SPLIT: scf.if
// SPLIT: llvm.store %{{.+}} {alignment = 16 : i64} : vector<8xf32>, !llvm.ptr<1>
// SPLIT: scf.for %{{.+}} = %c0 to %c7 step %c1
// SPLIT-COUNT-2: llvm.load %{{.+}} {alignment = 16 : i64} : !llvm.ptr<3> -> vector<8xf32>
// SPLIT-NOT: scf.for
// SPLIT: scf.for %{{.+}} = %c0 to %c4 step %c1
// SPLIT-COUNT-4: llvm.load %{{.+}} {alignment = 16 : i64} : !llvm.ptr<1> -> vector<8xf32>
// SPLIT: scf.for %{{.+}} = %c0 to %c2 step %c1
// SPLIT: llvm.load %{{.+}} {alignment = 16 : i64} : !llvm.ptr<1> -> vector<8xf32>
// SPLIT: llvm.store %{{.+}} {alignment = 16 : i64} : vector<8xf32>, !llvm.ptr<1>
// SPLIT: scf.for %{{.+}} = %c0 to %c14 step %c1 {
// SPLIT: llvm.load %{{.+}} {alignment = 16 : i64} : !llvm.ptr<3> -> vector<8xf32>
// SPLIT: llvm.store %{{.+}} {alignment = 16 : i64} : vector<8xf32>, !llvm.ptr<1>
// SPLIT: gpu.return
// Lowered (rows of 64 threads, asked for: the rule gives n = 1024 one
// warp): a folded block (TileConfig.h, foldsResidentBlocks): its size is
// the runtime's (at most 15 row groups of 64 threads), its row groups meet
// at their own named barriers (1 + the group, 64 threads) and each ends at
// its own last row. The partials start as the identity in
// shared memory, each row adds to them there (the thread that owns the
// columns); after the last row a barrier, then the first row group's
// threads combine the block's row groups' partials in order and write the
// block's row of the global partials once (n = 1024 fills every chunk: no
// guard).
// PARTIALS-LABEL: gpu.func @norm_bwd
// PARTIALS-NOT: known_block_size
// PARTIALS-SAME: kernel {
// PARTIALS: gpu.thread_id  x upper_bound 960
// PARTIALS: %[[GROUPS:.+]] = arith.divui %block_dim_x, %c64
// PARTIALS: scf.for
// PARTIALS: llvm.store %{{.+}} {alignment = 16 : i64} : vector<4xf32>, !llvm.ptr<3>
// PARTIALS: scf.for
// PARTIALS: nvvm.barrier id = %[[ID:.+]] number_of_threads = %c64_i32
// PARTIALS: nvvm.barrier id = %[[ID]] number_of_threads = %c64_i32
// PARTIALS: llvm.load %{{.+}} {alignment = 16 : i64} : !llvm.ptr<3> -> vector<4xf32>
// PARTIALS-NEXT: arith.addf
// PARTIALS-NEXT: llvm.store %{{.+}} {alignment = 16 : i64} : vector<4xf32>, !llvm.ptr<3>
// PARTIALS-COUNT-3: llvm.store %{{.+}} {alignment = 16 : i64} : vector<4xf32>, !llvm.ptr<3>
// PARTIALS-NEXT: }
// PARTIALS-NEXT: gpu.barrier
// PARTIALS-NEXT: %[[FIRST:.+]] = arith.cmpi eq, %{{.+}}, %c0
// PARTIALS-NEXT: scf.if %[[FIRST]]
// PARTIALS: llvm.load %{{.+}} {alignment = 16 : i64} : !llvm.ptr<3> -> vector<4xf32>
// PARTIALS: scf.for %{{.+}} = %c1 to %[[GROUPS]] step %c1 iter_args
// PARTIALS: llvm.load %{{.+}} {alignment = 16 : i64} : !llvm.ptr<3> -> vector<4xf32>
// PARTIALS-NEXT: arith.addf
// PARTIALS: %[[ROW:.+]] = arith.muli %block_id_x, %c1024
// PARTIALS: llvm.store %{{.+}} {alignment = 16 : i64} : vector<4xf32>, !llvm.ptr<1>
// PARTIALS-NOT: llvm.load %{{.+}} !llvm.ptr<1>
// PARTIALS: gpu.return
fuse.kernel @norm_bwd(%dy: !fuse.full<f32>, %x: !fuse.full<f32>, %rstd: !fuse.row<f32>) -> (dx: !fuse.full<f32>, dw: !fuse.col<f32>) {
  %rf = fuse.broadcast %rstd : !fuse.row<f32> to !fuse.full<f32>
  %xhat = fuse.mul %x, %rf : !fuse.full<f32>
  %g = fuse.mul %dy, %xhat : !fuse.full<f32>
  %c = fuse.reduce mean %g : !fuse.full<f32> to !fuse.row<f32>
  %cf = fuse.broadcast %c : !fuse.row<f32> to !fuse.full<f32>
  %t = fuse.mul %xhat, %cf : !fuse.full<f32>
  %d = fuse.sub %dy, %t : !fuse.full<f32>
  %dx = fuse.mul %d, %rf : !fuse.full<f32>
  %dw = fuse.reduce sum %g : !fuse.full<f32> to !fuse.col<f32>
  fuse.yield %dx, %dw : !fuse.full<f32>, !fuse.col<f32>
}

// -----

// Only what two passes read is staged: z, read by the output pass alone,
// streams from global memory (x alone: the same 128 KiB as @rms_norm).
// F32-LABEL: fuse.kernel @read_once
// F32-SAME: stage_bytes = 131072 : i64, staged_chunks = 16 : i64
fuse.kernel @read_once(%x: !fuse.full<f32>, %z: !fuse.full<f32>) -> (y: !fuse.full<f32>) {
  %s = fuse.reduce sum %x : !fuse.full<f32> to !fuse.row<f32>
  %sf = fuse.broadcast %s : !fuse.row<f32> to !fuse.full<f32>
  %xs = fuse.mul %x, %sf : !fuse.full<f32>
  %y = fuse.add %xs, %z : !fuse.full<f32>
  fuse.yield %y : !fuse.full<f32>
}

// -----

// A mask takes a byte per element in shared memory, as in global memory:
// x (128 KiB) and the mask (32 KiB) both staged whole.
// F32-LABEL: fuse.kernel @masked_sum
// F32-SAME: stage_bytes = 163840 : i64, staged_chunks = 16 : i64
fuse.kernel @masked_sum(%m: !fuse.full<i1>, %x: !fuse.full<f32>) -> (y: !fuse.full<f32>) {
  %nx = fuse.neg %x : !fuse.full<f32>
  %v = fuse.select %m, %x, %nx : !fuse.full<f32>
  %s = fuse.reduce sum %v : !fuse.full<f32> to !fuse.row<f32>
  %sf = fuse.broadcast %s : !fuse.row<f32> to !fuse.full<f32>
  %y = fuse.select %m, %sf, %x : !fuse.full<f32>
  fuse.yield %y : !fuse.full<f32>
}
