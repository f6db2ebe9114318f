// RUN: tilefuse-opt %s -split-input-file --pass-pipeline='builtin.module(fuse.kernel(fuse-specialize{dtype=bf16 n=0 abi=multi-tensor,pointer:lr:f64,per-tensor:step:f32,inplace:param_out:param,skip-if:f32}))' | FileCheck %s
// RUN: tilefuse-opt %s -split-input-file --pass-pipeline='builtin.module(fuse.kernel(fuse-specialize{dtype=f32 n=64 abi=pointer:lr:f32}))' | FileCheck %s --check-prefix=POINTER
// RUN: tilefuse-opt %s -split-input-file --pass-pipeline='builtin.module(fuse.kernel(fuse-specialize{dtype=bf16 n=0 abi=multi-tensor,pointer:lr:f64,per-tensor:step:f32,inplace:param_out:param,skip-if:f32}), fuse.kernel(fuse-select-tiles{target=sm_90}))' | FileCheck %s --check-prefix=GPU
// RUN: tilefuse-opt %s -split-input-file --pass-pipeline='builtin.module(fuse.kernel(fuse-specialize{dtype=f32 n=0 abi=multi-tensor}), fuse.kernel(fuse-select-tiles{target=cpu}))' | FileCheck %s --check-prefix=CPU

// The ABI is recorded canonically (sorted fields); the kernel's types are
// those of any specialization: only how it is called changes.
// CHECK-LABEL: fuse.kernel @step
// CHECK-SAME: (%param: !fuse.full<bf16>, %grad: !fuse.full<bf16>, %lr: !fuse.scalar<f32>, %step: !fuse.scalar<f32>) -> (param_out: !fuse.full<bf16>)
// CHECK-SAME: fuse.specialization = {abi = "multi-tensor,pointer:lr:f64,per-tensor:step:f32,inplace:param_out:param,skip-if:f32", aligned = true, dtype = bf16, n = 0 : i64}

// POINTER: fuse.specialization = {abi = "pointer:lr:f32", aligned = true, dtype = f32, n = 64 : i64}

// Multi-tensor tiles: 65536-element chunks, 512-thread blocks, 16-byte
// vectors (8 bf16), a persistent grid; the CPU runs 65536 elements a task.
// GPU: fuse.tile = {blocks_per_sm = 4 : i64, chunk_elements = 65536 : i64, chunks = 16 : i64, row_on_chip = false, rows_per_block = 1 : i64, target = "sm_90", threads_per_row = 512 : i64, vector_width = 8 : i64, warps = 16 : i64}
// CPU: fuse.tile = {chunk_elements = 65536 : i64, chunks = 1 : i64, row_on_chip = false, rows_per_task = 65536 : i64, target = "cpu", vector_width = 8 : i64}
fuse.kernel @step(%param: !fuse.full<f32>, %grad: !fuse.full<f32>, %lr: !fuse.scalar<f32>, %step: !fuse.scalar<f32>) -> (param_out: !fuse.full<f32>) {
  %s = fuse.div %lr, %step : !fuse.scalar<f32>
  %sb = fuse.broadcast %s : !fuse.scalar<f32> to !fuse.full<f32>
  %u = fuse.mul %grad, %sb : !fuse.full<f32>
  %p = fuse.sub %param, %u : !fuse.full<f32>
  fuse.yield %p : !fuse.full<f32>
}
