// RUN: tilefuse-opt %s --pass-pipeline='builtin.module(fuse.kernel(fuse-specialize{dtype=f32 n=0 abi=multi-tensor,pointer:lr:f64,per-tensor:step:f32,inplace:param_out:param,skip-if:f32}, fuse-select-tiles{target=sm_90}), fuse-lower-to-gpu, canonicalize, cse)' | FileCheck %s --check-prefix=GPU
// RUN: tilefuse-opt %s --pass-pipeline='builtin.module(fuse.kernel(fuse-specialize{dtype=f32 n=0 abi=multi-tensor,pointer:lr:f64,per-tensor:step:f32,inplace:param_out:param,skip-if:f32}, fuse-select-tiles{target=cpu}), fuse-lower-to-cpu, canonicalize, cse)' | FileCheck %s --check-prefix=CPU

// For a GPU, the table (passed by value; 4 KiB less the pointers to lr and the
// flag), lr and the skip flag read once, then per tensor of the table its
// element count, its chunks for this block, its pointers and step, and
// per chunk 16-byte vectors then the scalar tail.
// GPU-LABEL: gpu.func @step
// GPU-SAME: (%[[TABLE:.+]]: !llvm.ptr, %[[LR:.+]]: !llvm.ptr<1>, %[[SKIP:.+]]: !llvm.ptr<1>) kernel
// GPU-SAME: tilefuse.param_table = !llvm.array<510 x i64>
// GPU: %[[FLAG:.+]] = llvm.load %[[SKIP]] : !llvm.ptr<1> -> f32
// GPU: arith.cmpf une, %[[FLAG]]
// GPU: scf.if
// GPU: llvm.load %[[LR]] : !llvm.ptr<1> -> f64
// GPU: %[[COUNT:.+]] = llvm.load %[[TABLE]] {alignment = 8 : i64} : !llvm.ptr -> i64
// GPU: scf.for %{{.+}} = %{{.+}} to %{{.+}} step %{{.+}} iter_args(%[[FIRST:.+]] = %{{.+}}) -> (index)
// GPU: arith.ceildivui %{{.+}}, %c65536
// GPU: arith.remui %[[FIRST]], %grid_dim_x
// GPU: scf.if
// GPU: llvm.inttoptr
// GPU: llvm.load %{{.+}} : !llvm.ptr<1> -> f32
// GPU: scf.for %{{.+}} = %{{.+}} to %{{.+}} step %grid_dim_x
// GPU: llvm.load %{{.+}} {alignment = 16 : i64} : !llvm.ptr<1> -> vector<4xf32>
// GPU: llvm.store %{{.+}} {alignment = 16 : i64} : vector<4xf32>, !llvm.ptr<1>
// GPU: llvm.load %{{.+}} {alignment = 4 : i64} : !llvm.ptr<1> -> vector<1xf32>
// GPU: llvm.store %{{.+}} {alignment = 4 : i64} : vector<1xf32>, !llvm.ptr<1>

// For the CPU, a task's range of the table, 8-wide vectors with element alignment
// (tasks start anywhere), then the tail.
// CPU-LABEL: func.func @step(%{{.+}}: !llvm.ptr, %{{.+}}: !llvm.ptr, %{{.+}}: !llvm.ptr, %{{.+}}: i64, %{{.+}}: i64, %{{.+}}: i64, %{{.+}}: i64)
// CPU: llvm.load %{{.+}} {alignment = 4 : i64} : !llvm.ptr -> vector<8xf32>
// CPU: llvm.load %{{.+}} {alignment = 4 : i64} : !llvm.ptr -> vector<1xf32>
fuse.kernel @step(%param: !fuse.full<f32>, %grad: !fuse.full<f32>, %lr: !fuse.scalar<f32>, %step: !fuse.scalar<f32>) -> (param_out: !fuse.full<f32>) {
  %s = fuse.div %lr, %step : !fuse.scalar<f32>
  %sb = fuse.broadcast %s : !fuse.scalar<f32> to !fuse.full<f32>
  %u = fuse.mul %grad, %sb : !fuse.full<f32>
  %p = fuse.sub %param, %u : !fuse.full<f32>
  fuse.yield %p : !fuse.full<f32>
}
