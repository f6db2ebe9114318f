// RUN: not tilefuse-opt %s --pass-pipeline='builtin.module(fuse.kernel(fuse-specialize{dtype=f32 n=0 abi=multi-tensor,bogus}))' 2>&1 | FileCheck %s --check-prefix=MALFORMED
// RUN: not tilefuse-opt %s --pass-pipeline='builtin.module(fuse.kernel(fuse-specialize{dtype=f32 n=8 abi=multi-tensor}))' 2>&1 | FileCheck %s --check-prefix=SIZE
// RUN: not tilefuse-opt %s --pass-pipeline='builtin.module(fuse.kernel(fuse-specialize{dtype=f32 n=8 abi=pointer:x:f32}))' 2>&1 | FileCheck %s --check-prefix=NOTSCALAR
// RUN: not tilefuse-opt %s --pass-pipeline='builtin.module(fuse.kernel(fuse-specialize{dtype=f32 n=8 abi=pointer:s:u8}))' 2>&1 | FileCheck %s --check-prefix=DTYPE
// RUN: not tilefuse-opt %s --pass-pipeline='builtin.module(fuse.kernel(fuse-specialize{dtype=f32 n=8 abi=per-tensor:s:f32}))' 2>&1 | FileCheck %s --check-prefix=NEEDSMULTI
// RUN: not tilefuse-opt %s --pass-pipeline='builtin.module(fuse.kernel(fuse-specialize{dtype=f32 n=0 abi=multi-tensor,pointer:s:f32,per-tensor:s:f32}))' 2>&1 | FileCheck %s --check-prefix=TWICE
// RUN: not tilefuse-opt %s --pass-pipeline='builtin.module(fuse.kernel(fuse-specialize{dtype=f32 n=0 abi=multi-tensor,inplace:y:w}))' 2>&1 | FileCheck %s --check-prefix=INPLACE
// RUN: not tilefuse-opt %s --pass-pipeline='builtin.module(fuse.kernel(fuse-specialize{dtype=f32 n=0 abi=multi-tensor,inplace:y:i}))' 2>&1 | FileCheck %s --check-prefix=INPLACETYPE
// RUN: not tilefuse-opt %s -split-input-file --pass-pipeline='builtin.module(fuse.kernel(fuse-specialize{dtype=f32 n=0 abi=multi-tensor}))' 2>&1 | FileCheck %s --check-prefix=ELEMENTWISE

// MALFORMED: error: fuse-specialize: malformed abi 'multi-tensor,bogus'
// SIZE: error: fuse-specialize: a multi-tensor kernel runs over tensors of any size; n must be 0, got 8
// NOTSCALAR: error: fuse-specialize: pointer 'x' is not a scalar input of @k
// DTYPE: error: fuse-specialize: pointer 's' has unsupported dtype 'u8'
// NEEDSMULTI: error: fuse-specialize: per-tensor scalars, in-place outputs and skip-if need a multi-tensor kernel
// TWICE: error: fuse-specialize: scalar 's' is bound both by pointer and per tensor
// INPLACE: error: fuse-specialize: inplace:y:w names no output 'y' and input 'w' of @k
// INPLACETYPE: error: fuse-specialize: output 'y' ('!fuse.full<f32>') cannot update input 'i' ('!fuse.full<i64>') in place
fuse.kernel @k(%x: !fuse.full<f32>, %i: !fuse.full<i64>, %s: !fuse.scalar<f32>) -> (y: !fuse.full<f32>) {
  %sb = fuse.broadcast %s : !fuse.scalar<f32> to !fuse.full<f32>
  %y = fuse.mul %x, %sb : !fuse.full<f32>
  fuse.yield %y : !fuse.full<f32>
}

// -----

// Multi-tensor kernels are elementwise over full tensors and scalars.
// ELEMENTWISE: error: fuse-specialize: a multi-tensor kernel takes full tensors and scalars and returns full tensors; 'w' is col
fuse.kernel @col(%x: !fuse.full<f32>, %w: !fuse.col<f32>) -> (y: !fuse.full<f32>) {
  %wf = fuse.broadcast %w : !fuse.col<f32> to !fuse.full<f32>
  %y = fuse.mul %x, %wf : !fuse.full<f32>
  fuse.yield %y : !fuse.full<f32>
}

// -----

// ELEMENTWISE: error: fuse-specialize: a multi-tensor kernel is elementwise; fuse.reduce is not
fuse.kernel @sum(%x: !fuse.full<f32>) -> (y: !fuse.full<f32>) {
  %s = fuse.reduce sum %x : !fuse.full<f32> to !fuse.row<f32>
  %sf = fuse.broadcast %s : !fuse.row<f32> to !fuse.full<f32>
  %y = fuse.mul %x, %sf : !fuse.full<f32>
  fuse.yield %y : !fuse.full<f32>
}

// -----

// ELEMENTWISE: error: fuse-specialize: a multi-tensor kernel is elementwise; fuse.row_length is not
fuse.kernel @len(%x: !fuse.full<f32>) -> (y: !fuse.full<f32>) {
  %n = fuse.row_length : !fuse.scalar<f32>
  %nf = fuse.broadcast %n : !fuse.scalar<f32> to !fuse.full<f32>
  %y = fuse.mul %x, %nf : !fuse.full<f32>
  fuse.yield %y : !fuse.full<f32>
}
