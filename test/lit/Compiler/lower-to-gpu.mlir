// RUN: tilefuse-opt %s --pass-pipeline='builtin.module(fuse.kernel(fuse-specialize{dtype=bf16 n=2048}, fuse-select-tiles{target=sm_90}), fuse-lower-to-gpu, canonicalize, cse)' | FileCheck %s
// RUN: tilefuse-opt %s --pass-pipeline='builtin.module(fuse.kernel(fuse-specialize{dtype=bf16 n=2048}, fuse-select-tiles{target=sm_90 row-on-chip=false}), fuse-lower-to-gpu, canonicalize, cse)' | FileCheck %s --check-prefix=STREAMED
// Wide rows: 32 columns (a 128-byte line of each partial row) per block, 8
// threads per column; at n = 4096 16 columns (256 blocks), 16 threads.
// RUN: tilefuse-opt %s --pass-pipeline='builtin.module(fuse.kernel(fuse-specialize{dtype=bf16 n=8192}, fuse-select-tiles{target=sm_90}), fuse-lower-to-gpu, canonicalize, cse)' | FileCheck %s --check-prefix=WIDE
// RUN: tilefuse-opt %s --pass-pipeline='builtin.module(fuse.kernel(fuse-specialize{dtype=bf16 n=4096}, fuse-select-tiles{target=sm_90}), fuse-lower-to-gpu, canonicalize, cse)' | FileCheck %s --check-prefix=MEDIUM
// Rows of at most 32 threads (n = 256: 32 rows of 8 threads a block) combine
// by shuffles alone: no workgroup memory.
// RUN: tilefuse-opt %s --pass-pipeline='builtin.module(fuse.kernel(fuse-specialize{dtype=bf16 n=256}, fuse-select-tiles{target=sm_90}), fuse-lower-to-gpu, canonicalize, cse)' | FileCheck %s --check-prefix=NARROW
// NARROW: gpu.func @softmax_colsum(%{{.+}}: i64) kernel attributes
// NARROW-SAME: known_block_size = array<i32: 256, 1, 1>
// NARROW-LABEL: gpu.func @softmax_colsum_finalize(
// A block of one row group (n = 8192) has no row past the end: its row is
// frozen (opaque to loop strength reduction), neither clamped nor masked.
// WIDE-LABEL: gpu.func @softmax_colsum(
// WIDE: llvm.freeze %{{.+}} : i64
// WIDE-NOT: arith.select
// WIDE-LABEL: gpu.func @softmax_colsum_finalize(
// WIDE: arith.remui %{{.+}}, %c32
// WIDE: arith.ceildivui %{{.+}}, %c8
// MEDIUM-LABEL: gpu.func @softmax_colsum_finalize(
// MEDIUM: arith.remui %{{.+}}, %c16
// MEDIUM: arith.ceildivui %{{.+}}, %c16
// Offsets past PTX's signed 32 bits (2^31 - 1; 14 row groups of 40M
// floats) go into the address register.
// RUN: tilefuse-opt %s --pass-pipeline='builtin.module(fuse.kernel(fuse-specialize{dtype=bf16 n=40000000}, fuse-select-tiles{target=sm_90}), fuse-lower-to-gpu, canonicalize, cse)' | FileCheck %s --check-prefix=HUGE
// HUGE-LABEL: gpu.func @softmax_colsum_finalize(
// HUGE: %[[FAR_OFFSET:.+]] = llvm.mlir.constant(2240000000 : i64) : i64
// HUGE: %[[ROWS:.+]] = llvm.getelementptr %{{[0-9]+}}[%{{.+}}] : (!llvm.ptr<1>, i64) -> !llvm.ptr<1>, f32
// HUGE: llvm.inline_asm asm_dialect = att "@$1 ld.global.b32 $0, [$2+2080000000];", "=f,b,l,0" %{{.+}}, %[[ROWS]], %cst
// HUGE-NEXT: %[[FAR:.+]] = llvm.getelementptr %[[ROWS]][%[[FAR_OFFSET]]] : (!llvm.ptr<1>, i64) -> !llvm.ptr<1>, i8
// HUGE-NEXT: llvm.inline_asm asm_dialect = att "@$1 ld.global.b32 $0, [$2+0];", "=f,b,l,0" %{{.+}}, %[[FAR]], %cst

// A softmax-like row program with a column reduction: one row reduction
// pass (max), one more (sum of exp), then the outputs.

// CHECK: module attributes {gpu.container_module}
// CHECK: gpu.module @tilefuse_kernels
// Inputs (x, then the scalar), outputs (y, then the partials of the column
// sum), rows; workgroup memory for the cross-warp step: 4 rows per block x
// 2 warps per row x 1 reduction per pass.
// CHECK: gpu.func @softmax_colsum(%[[X:.+]]: !llvm.ptr<1>, %[[T:.+]]: f32, %[[Y:.+]]: !llvm.ptr<1>, %[[PARTIALS:.+]]: !llvm.ptr<1>, %[[ROWS:.+]]: i64)
// CHECK-SAME: workgroup(%[[WG:.+]] : memref<8xf32, #gpu.address_space<workgroup>>) kernel
// CHECK-SAME: known_block_size = array<i32: 256, 1, 1>
// Partials start at the identity, then every row iteration of the block.
// CHECK: scf.for
// CHECK: llvm.store %{{.+}}, %{{.+}} {alignment = 16 : i64} : vector<8xf32>, !llvm.ptr<1>
// CHECK: scf.for
// A row group past the last row is clamped to it and loads nothing
// (predicated PTX loads of 16 bytes).
// CHECK: %[[VALID:.+]] = arith.cmpi ult
// CHECK: arith.select %[[VALID]]
// CHECK: llvm.inline_asm has_side_effects {{.+}} "@$4 ld.global.v4.b32 {$0, $1, $2, $3}, [$5+0];", "=r,=r,=r,=r,b,l,0,1,2,3" %[[VALID]],
// CHECK: vector.bitcast %{{.+}} : vector<4xi32> to vector<8xbf16>
// CHECK: vector.reduction <maximumf>
// CHECK: gpu.shuffle  xor
// CHECK: gpu.barrier
// CHECK: memref.load %[[WG]]
// CHECK: gpu.barrier
// CHECK: math.exp
// CHECK: vector.reduction <add>
// CHECK: gpu.shuffle  xor
// CHECK: scf.if
// CHECK: llvm.store %{{.+}} {alignment = 16 : i64} : vector<8xbf16>, !llvm.ptr<1>
// CHECK: scf.if
// CHECK: llvm.load %{{.+}} {alignment = 16 : i64} : !llvm.ptr<1> -> vector<8xf32>
// CHECK: llvm.store %{{.+}} {alignment = 16 : i64} : vector<8xf32>, !llvm.ptr<1>
// CHECK: gpu.return
// The final reduction: 8 columns per block at n = 2048 (256 blocks; 32
// would leave 64), 32 threads per column, each combining its contiguous
// share of the row groups in order; after a barrier the first of them
// combines the 32 shares in order.
// CHECK: gpu.func @softmax_colsum_finalize(%{{.+}}: !llvm.ptr<1>, %{{.+}}: !llvm.ptr<1>, %[[GROUPS:.+]]: i64, %{{.+}}: i64) workgroup(%[[SHARES:.+]] : memref<256xf32, #gpu.address_space<workgroup>>) kernel
// CHECK: %[[COLUMN:.+]] = arith.remui %[[THREAD:.+]], %c8
// CHECK: %[[SLICE:.+]] = arith.divui %[[THREAD]], %c8
// CHECK: %[[IN_RANGE:.+]] = arith.cmpi ult, %{{.+}}, %c2048
// CHECK: %[[SHARE:.+]] = arith.ceildivui %{{.+}}, %c32
// CHECK: arith.muli %[[SLICE]], %[[SHARE]]
// CHECK: arith.select %[[IN_RANGE]], %{{.+}}, %c0
// Sixteen row groups an iteration from one address (a row group is 2048
// floats): the first loaded, row k of the group only where k < the rows
// left in the thread's share (PTX loads predicated on it, at constant
// offsets, tied to the identity: the rows past the share move no bytes and
// add 0), all before they are added in pairs; their total joins the
// running one. Its loop annotation keeps LLVM from unrolling it. The slice's
// first address is frozen: opaque to loop strength reduction.
// CHECK: %[[FIRST:.+]] = llvm.getelementptr %arg0[%{{.+}}] : (!llvm.ptr<1>, i64) -> !llvm.ptr<1>, f32
// CHECK-NEXT: %[[START:.+]] = llvm.freeze %[[FIRST]] : !llvm.ptr<1>
// CHECK: scf.for %{{.+}} iter_args(%[[RUNNING:.+]] = %{{.+}}) -> (f32)
// CHECK: %[[LEFT:.+]] = arith.subi
// CHECK-NEXT: %[[HAS1:.+]] = arith.cmpi ugt, %[[LEFT]], %c1 : index
// CHECK-NEXT: %[[HAS2:.+]] = arith.cmpi ugt, %[[LEFT]], %c2 : index
// CHECK-NEXT: %[[HAS3:.+]] = arith.cmpi ugt, %[[LEFT]], %c3 : index
// CHECK-NEXT: %[[HAS4:.+]] = arith.cmpi ugt, %[[LEFT]], %c4 : index
// CHECK-NEXT: %[[HAS5:.+]] = arith.cmpi ugt, %[[LEFT]], %c5 : index
// CHECK-NEXT: %[[HAS6:.+]] = arith.cmpi ugt, %[[LEFT]], %c6 : index
// CHECK-NEXT: %[[HAS7:.+]] = arith.cmpi ugt, %[[LEFT]], %c7 : index
// CHECK-NEXT: %[[HAS8:.+]] = arith.cmpi ugt, %[[LEFT]], %c8 : index
// CHECK-NEXT: %[[HAS9:.+]] = arith.cmpi ugt, %[[LEFT]], %c9 : index
// CHECK-NEXT: %[[HAS10:.+]] = arith.cmpi ugt, %[[LEFT]], %c10 : index
// CHECK-NEXT: %[[HAS11:.+]] = arith.cmpi ugt, %[[LEFT]], %c11 : index
// CHECK-NEXT: %[[HAS12:.+]] = arith.cmpi ugt, %[[LEFT]], %c12 : index
// CHECK-NEXT: %[[HAS13:.+]] = arith.cmpi ugt, %[[LEFT]], %c13 : index
// CHECK-NEXT: %[[HAS14:.+]] = arith.cmpi ugt, %[[LEFT]], %c14 : index
// CHECK-NEXT: %[[HAS15:.+]] = arith.cmpi ugt, %[[LEFT]], %c15 : index
// CHECK: %[[ROWS:.+]] = llvm.getelementptr %[[START]][%{{.+}}] : (!llvm.ptr<1>, i64) -> !llvm.ptr<1>, f32
// CHECK-NEXT: %[[ROW0:.+]] = llvm.load %[[ROWS]] : !llvm.ptr<1> -> f32
// CHECK-NEXT: %[[ROW1:.+]] = llvm.inline_asm asm_dialect = att "@$1 ld.global.b32 $0, [$2+8192];", "=f,b,l,0" %[[HAS1]], %[[ROWS]], %cst : (i1, !llvm.ptr<1>, f32) -> f32
// CHECK-NEXT: llvm.inline_asm asm_dialect = att "@$1 ld.global.b32 $0, [$2+16384];", "=f,b,l,0" %[[HAS2]], %[[ROWS]], %cst : (i1, !llvm.ptr<1>, f32) -> f32
// CHECK-NEXT: llvm.inline_asm asm_dialect = att "@$1 ld.global.b32 $0, [$2+24576];", "=f,b,l,0" %[[HAS3]], %[[ROWS]], %cst : (i1, !llvm.ptr<1>, f32) -> f32
// CHECK-NEXT: llvm.inline_asm asm_dialect = att "@$1 ld.global.b32 $0, [$2+32768];", "=f,b,l,0" %[[HAS4]], %[[ROWS]], %cst : (i1, !llvm.ptr<1>, f32) -> f32
// CHECK-NEXT: llvm.inline_asm asm_dialect = att "@$1 ld.global.b32 $0, [$2+40960];", "=f,b,l,0" %[[HAS5]], %[[ROWS]], %cst : (i1, !llvm.ptr<1>, f32) -> f32
// CHECK-NEXT: llvm.inline_asm asm_dialect = att "@$1 ld.global.b32 $0, [$2+49152];", "=f,b,l,0" %[[HAS6]], %[[ROWS]], %cst : (i1, !llvm.ptr<1>, f32) -> f32
// CHECK-NEXT: llvm.inline_asm asm_dialect = att "@$1 ld.global.b32 $0, [$2+57344];", "=f,b,l,0" %[[HAS7]], %[[ROWS]], %cst : (i1, !llvm.ptr<1>, f32) -> f32
// CHECK-NEXT: llvm.inline_asm asm_dialect = att "@$1 ld.global.b32 $0, [$2+65536];", "=f,b,l,0" %[[HAS8]], %[[ROWS]], %cst : (i1, !llvm.ptr<1>, f32) -> f32
// CHECK-NEXT: llvm.inline_asm asm_dialect = att "@$1 ld.global.b32 $0, [$2+73728];", "=f,b,l,0" %[[HAS9]], %[[ROWS]], %cst : (i1, !llvm.ptr<1>, f32) -> f32
// CHECK-NEXT: llvm.inline_asm asm_dialect = att "@$1 ld.global.b32 $0, [$2+81920];", "=f,b,l,0" %[[HAS10]], %[[ROWS]], %cst : (i1, !llvm.ptr<1>, f32) -> f32
// CHECK-NEXT: llvm.inline_asm asm_dialect = att "@$1 ld.global.b32 $0, [$2+90112];", "=f,b,l,0" %[[HAS11]], %[[ROWS]], %cst : (i1, !llvm.ptr<1>, f32) -> f32
// CHECK-NEXT: llvm.inline_asm asm_dialect = att "@$1 ld.global.b32 $0, [$2+98304];", "=f,b,l,0" %[[HAS12]], %[[ROWS]], %cst : (i1, !llvm.ptr<1>, f32) -> f32
// CHECK-NEXT: llvm.inline_asm asm_dialect = att "@$1 ld.global.b32 $0, [$2+106496];", "=f,b,l,0" %[[HAS13]], %[[ROWS]], %cst : (i1, !llvm.ptr<1>, f32) -> f32
// CHECK-NEXT: llvm.inline_asm asm_dialect = att "@$1 ld.global.b32 $0, [$2+114688];", "=f,b,l,0" %[[HAS14]], %[[ROWS]], %cst : (i1, !llvm.ptr<1>, f32) -> f32
// CHECK-NEXT: llvm.inline_asm asm_dialect = att "@$1 ld.global.b32 $0, [$2+122880];", "=f,b,l,0" %[[HAS15]], %[[ROWS]], %cst : (i1, !llvm.ptr<1>, f32) -> f32
// CHECK-NEXT: arith.addf %[[ROW0]], %[[ROW1]] : f32
// CHECK-COUNT-14: arith.addf
// CHECK-NEXT: arith.addf %[[RUNNING]], %{{.+}} : f32
// CHECK-NEXT: scf.yield
// CHECK-NEXT: } {llvm.loop_annotation = #{{.+}}}
// CHECK-NOT: llvm.load
// CHECK: memref.store %{{.+}}, %[[SHARES]][%[[THREAD]]]
// CHECK: gpu.barrier
// CHECK: scf.if
// CHECK-COUNT-32: memref.load %[[SHARES]]
// CHECK: arith.truncf %{{.+}} : f32 to bf16

// Streamed: chunks loop with the partial reductions carried.
// STREAMED: scf.for %{{.+}} = %{{.+}} to %{{.+}} step %{{.+}} iter_args(%{{.+}} = %{{.+}}) -> (vector<8xf32>)
// STREAMED: scf.yield %{{.+}} : vector<8xf32>
// STREAMED: gpu.shuffle  xor
fuse.kernel @softmax_colsum(%x: !fuse.full<f32>, %t: !fuse.scalar<f32>) -> (y: !fuse.full<f32>, colsum: !fuse.col<f32>) {
  %max = fuse.reduce max %x : !fuse.full<f32> to !fuse.row<f32>
  %max_f = fuse.broadcast %max : !fuse.row<f32> to !fuse.full<f32>
  %shifted = fuse.sub %x, %max_f : !fuse.full<f32>
  %e = fuse.exp %shifted : !fuse.full<f32>
  %sum = fuse.reduce sum %e : !fuse.full<f32> to !fuse.row<f32>
  %sum_f = fuse.broadcast %sum : !fuse.row<f32> to !fuse.full<f32>
  %y = fuse.div %e, %sum_f : !fuse.full<f32>
  %t_f = fuse.broadcast %t : !fuse.scalar<f32> to !fuse.full<f32>
  %scaled = fuse.mul %y, %t_f : !fuse.full<f32>
  %colsum = fuse.reduce sum %scaled : !fuse.full<f32> to !fuse.col<f32>
  fuse.yield %y, %colsum : !fuse.full<f32>, !fuse.col<f32>
}
