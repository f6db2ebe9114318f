// RUN: tilefuse-opt %s -split-input-file --pass-pipeline='builtin.module(fuse.kernel(fuse-specialize{dtype=bf16 n=131072}, fuse-select-tiles{target=sm_90}, fuse-merge-reductions), fuse-lower-to-gpu, canonicalize, cse)' | FileCheck %s --check-prefix=GPU
// RUN: tilefuse-opt %s -split-input-file --pass-pipeline='builtin.module(fuse.kernel(fuse-specialize{dtype=f32 n=4096}, fuse-select-tiles{target=cpu}, fuse-merge-reductions), fuse-lower-to-cpu, canonicalize, cse)' | FileCheck %s --check-prefix=CPU
// RUN: tilefuse-opt %s -split-input-file --pass-pipeline='builtin.module(fuse.kernel(fuse-specialize{dtype=bf16 n=122872}, fuse-select-tiles{target=sm_90}, fuse-merge-reductions), fuse-lower-to-gpu, canonicalize, cse)' | FileCheck %s --check-prefix=PARTIAL

// A streamed row's log-sum-exp in one pass: the chunks are folded in blocks
// of 16 (blocked accumulation) into a one-lane running max and sum: a
// chunk's max joins the max, the sum is rescaled by one exp, and the
// chunk's exp(x - max) join it as a tree (one exp per element); the mean
// beside it folds into one lane too. Then threads merge their states. On
// the GPU the innermost loop is unrolled by 4: four independent loads in
// flight per thread.
// GPU-LABEL: gpu.func @logsumexp
// GPU-NOT: tilefuse.keep_load_order
// GPU: scf.for %{{.+}} = %c0 to %c2 step %c1 iter_args(%{{.+}} = %{{.+}}, %{{.+}} = %{{.+}}, %{{.+}} = %{{.+}}) -> (vector<1xf32>, vector<1xf32>, vector<1xf32>)
// GPU: scf.for %{{.+}} step %c4 iter_args
// GPU: llvm.load %{{.+}} {alignment = 16 : i64} : !llvm.ptr<1> -> vector<8xbf16>
// GPU: vector.reduction <maximumf>, %{{.+}} : vector<8xf32> into f32
// GPU: arith.cmpf oeq, %{{.+}}, %{{.+}} : f32
// bf16 storage: exp(x) as exp2(x * log2(e)) (ex2.approx.f32 in PTX): one
// rescaling the sum, one per element.
// GPU-COUNT-9: math.exp2 %{{.+}} : f32
// GPU-NOT: math.exp2
// GPU: vector.reduction <add>, %{{.+}}, %{{.+}} fastmath<reassoc> : vector<8xf32> into f32
// GPU: llvm.load %{{.+}} {alignment = 16 : i64} : !llvm.ptr<1> -> vector<8xbf16>
// GPU: vector.reduction <add>, %{{.+}}, %{{.+}} fastmath<reassoc> : vector<8xf32> into f32
// GPU: scf.yield %{{.+}}, %{{.+}}, %{{.+}} : vector<1xf32>, vector<1xf32>, vector<1xf32>
// GPU: gpu.shuffle  xor
// GPU-NOT: llvm.load {{.+}} vector<8xbf16>
// GPU: gpu.barrier
// GPU: math.absf
// GPU: gpu.return
// With n = 122872 (30 chunks of 512 threads x 8), a thread's chunks past
// the row's end hold -inf before their max and their exps.
// PARTIAL-LABEL: gpu.func @logsumexp
// PARTIAL: %[[NEG_INF:.+]] = arith.constant dense<0xFF800000> : vector<8xf32>
// PARTIAL: %[[VALID:.+]] = arith.cmpi ult, %{{.+}}, %c122872 : index
// PARTIAL: llvm.load %{{.+}} : !llvm.ptr<1> -> vector<8xbf16>
// PARTIAL: %[[MASKED:.+]] = arith.select %[[VALID]], %{{.+}}, %[[NEG_INF]] : vector<8xf32>
// PARTIAL: vector.reduction <maximumf>, %[[MASKED]] : vector<8xf32> into f32
// CPU-LABEL: func.func @logsumexp
// CPU: scf.for %{{.+}} iter_args(%{{.+}} = %{{.+}}, %{{.+}} = %{{.+}}, %{{.+}} = %{{.+}}) -> (vector<1xf32>, vector<1xf32>, vector<1xf32>)
// CPU: llvm.load %{{.+}} {alignment = 16 : i64} : !llvm.ptr -> vector<8xf32>
// CPU: vector.reduction <maximumf>
// CPU: math.exp %{{.+}} : vector<8xf32>
// CPU: vector.reduction <add>, %{{.+}}, %{{.+}} fastmath<reassoc> : vector<8xf32> into f32
// CPU: scf.yield
// CPU-NOT: llvm.load {{.+}} vector<8xf32>
// CPU: math.absf
// CPU: return
fuse.kernel @logsumexp(%x: !fuse.full<f32>) -> (lse: !fuse.row<f32>, mean: !fuse.row<f32>) {
  %max = fuse.reduce max %x : !fuse.full<f32> to !fuse.row<f32>
  %max_f = fuse.broadcast %max : !fuse.row<f32> to !fuse.full<f32>
  %shifted = fuse.sub %x, %max_f : !fuse.full<f32>
  %e = fuse.exp %shifted : !fuse.full<f32>
  %sum = fuse.reduce sum %e : !fuse.full<f32> to !fuse.row<f32>
  %log = fuse.log %sum : !fuse.row<f32>
  %lse = fuse.add %max, %log : !fuse.row<f32>
  %mean = fuse.reduce mean %x : !fuse.full<f32> to !fuse.row<f32>
  fuse.yield %lse, %mean : !fuse.row<f32>, !fuse.row<f32>
}

// -----

// A loss's weighted sum about the max in one pass (fuse.max_deviation): a
// one-lane running max, sum of weights and sum of w * (x - max). A chunk's
// max joins the max (-inf shifts by 0); the sum so far moves to a grown
// max by (new - old) * the weights so far, nothing where the max stayed;
// the chunk's w * (x - max) and w join the sums as trees. No exp.
// GPU-LABEL: gpu.func @weighted_deviation
// GPU: scf.for %{{.+}} = %c0 to %c2 step %c1 iter_args(%{{.+}} = %{{.+}}, %{{.+}} = %{{.+}}, %{{.+}} = %{{.+}}) -> (vector<1xf32>, vector<1xf32>, vector<1xf32>)
// GPU: llvm.load %{{.+}} {alignment = 16 : i64} : !llvm.ptr<1> -> vector<8xbf16>
// GPU: llvm.load %{{.+}} {alignment = 16 : i64} : !llvm.ptr<1> -> vector<8xbf16>
// GPU: %[[CHUNK_MAX:.+]] = vector.reduction <maximumf>
// GPU-NEXT: %[[MAX:.+]] = arith.maximumf %{{.+}}, %[[CHUNK_MAX]] : f32
// GPU-NEXT: %[[EMPTY:.+]] = arith.cmpf oeq, %[[MAX]], %{{.+}} : f32
// GPU-NEXT: %[[CENTER:.+]] = arith.select %[[EMPTY]], %{{.+}}, %[[MAX]] : f32
// GPU: %[[XS:.+]] = arith.subf %{{.+}}, %{{.+}} : vector<8xf32>
// GPU-NEXT: %[[TERMS:.+]] = arith.mulf %{{.+}}, %[[XS]] : vector<8xf32>
// GPU: %[[SAME:.+]] = arith.cmpf oeq, %{{.+}}, %[[MAX]] : f32
// GPU-NEXT: %[[SHIFT:.+]] = arith.select %[[SAME]], %{{.+}}, %{{.+}} : f32
// GPU: %[[MOVED:.+]] = arith.subf %{{.+}}, %[[SHIFT]] : f32
// GPU-NEXT: vector.reduction <add>, %[[TERMS]], %[[MOVED]] fastmath<reassoc> : vector<8xf32> into f32
// GPU-NEXT: vector.reduction <add>, %{{.+}}, %{{.+}} fastmath<reassoc> : vector<8xf32> into f32
// GPU-NOT: math.exp
// GPU: scf.yield %{{.+}}, %{{.+}}, %{{.+}} : vector<1xf32>, vector<1xf32>, vector<1xf32>
// GPU: gpu.shuffle  xor
// GPU-NOT: llvm.load {{.+}} vector<8xbf16>
// GPU: math.absf
// CPU-LABEL: func.func @weighted_deviation
// CPU: scf.for %{{.+}} iter_args(%{{.+}} = %{{.+}}, %{{.+}} = %{{.+}}, %{{.+}} = %{{.+}}) -> (vector<1xf32>, vector<1xf32>, vector<1xf32>)
// CPU: vector.reduction <maximumf>
// CPU: vector.reduction <add>, %{{.+}}, %{{.+}} fastmath<reassoc> : vector<8xf32> into f32
// CPU-NEXT: vector.reduction <add>, %{{.+}}, %{{.+}} fastmath<reassoc> : vector<8xf32> into f32
// CPU: math.absf
// CPU: return
fuse.kernel @weighted_deviation(%x: !fuse.full<f32>, %w: !fuse.full<f32>) -> (dev: !fuse.row<f32>) {
  %max = fuse.reduce max %x : !fuse.full<f32> to !fuse.row<f32>
  %max_f = fuse.broadcast %max : !fuse.row<f32> to !fuse.full<f32>
  %shifted = fuse.sub %x, %max_f : !fuse.full<f32>
  %wd = fuse.mul %w, %shifted : !fuse.full<f32>
  %dev = fuse.reduce sum %wd : !fuse.full<f32> to !fuse.row<f32>
  fuse.yield %dev : !fuse.row<f32>
}

// -----

// A sum of exp and a sum about the max of the same input (label smoothing
// beside the log-sum-exp) share one running max: one chunk max and one
// x - max per chunk, and the running maxes carried as one value.
// GPU-LABEL: gpu.func @smoothed_logsumexp
// GPU: scf.for %{{.+}} step %c4 iter_args
// GPU: llvm.load %{{.+}} {alignment = 16 : i64} : !llvm.ptr<1> -> vector<8xbf16>
// GPU: vector.reduction <maximumf>
// GPU-NOT: vector.reduction <maximumf>
// GPU: arith.subf %{{.+}}, %{{.+}} : vector<8xf32>
// GPU-NOT: arith.subf %{{.+}}, %{{.+}} : vector<8xf32>
// GPU: llvm.load %{{.+}} {alignment = 16 : i64} : !llvm.ptr<1> -> vector<8xbf16>
// GPU: scf.yield %[[MAX:[^,]+]], %{{[^,]+}}, %[[MAX]], %{{[^,]+}}, %{{[^,]+}} : vector<1xf32>, vector<1xf32>, vector<1xf32>, vector<1xf32>, vector<1xf32>
fuse.kernel @smoothed_logsumexp(%x: !fuse.full<f32>) -> (lse: !fuse.row<f32>, dev: !fuse.row<f32>) {
  %max = fuse.reduce max %x : !fuse.full<f32> to !fuse.row<f32>
  %max_f = fuse.broadcast %max : !fuse.row<f32> to !fuse.full<f32>
  %shifted = fuse.sub %x, %max_f : !fuse.full<f32>
  %e = fuse.exp %shifted : !fuse.full<f32>
  %sum = fuse.reduce sum %e : !fuse.full<f32> to !fuse.row<f32>
  %log = fuse.log %sum : !fuse.row<f32>
  %lse = fuse.add %max, %log : !fuse.row<f32>
  %dev = fuse.reduce sum %shifted : !fuse.full<f32> to !fuse.row<f32>
  fuse.yield %lse, %dev : !fuse.row<f32>, !fuse.row<f32>
}

// -----

// LayerNorm over a streamed row in two passes (moments, then the output)
// instead of three. The moments pass merges each chunk into a one-lane
// state by Chan's formula: the chunk's x - x[row, 0], their mean (each
// divided by the width, 8, then summed from -0.0: no overflow near the
// type's largest), their squared deviations from it summed (two passes in
// registers), then one division a chunk (the chunk's share of the count);
// the plain sum of x beside it (the mean). Four chunks an iteration;
// blocks of 16 chunks merge the same way.
// The row's 16 warps publish 4 state values each in workgroup memory.
// GPU-LABEL: gpu.func @layer_norm
// GPU-SAME: workgroup(%{{.+}} : memref<64xf32, #gpu.address_space<workgroup>>)
// GPU-SAME: tilefuse.keep_load_order
// GPU-DAG: %[[N:.+]] = arith.constant 1.310720e+05 : f32
// GPU-DAG: %[[MARGIN:.+]] = arith.constant 8.000000e+00 : f32
// GPU-DAG: %[[EIGHTH:.+]] = arith.constant dense<1.250000e-01> : vector<8xf32>
// GPU-DAG: %[[COUNT:.+]] = arith.constant dense<8.000000e+00> : vector<1xf32>
// GPU-DAG: %[[NEG_ZERO:.+]] = arith.constant -0.000000e+00 : f32
// GPU-DAG: %[[ZERO:.+]] = arith.constant dense<0.000000e+00> : vector<1xf32>
// GPU: %[[HEAD:.+]] = llvm.load %{{.+}} {alignment = 16 : i64} : !llvm.ptr<1> -> vector<8xbf16>
// GPU-NEXT: %[[HEAD_F32:.+]] = arith.extf %[[HEAD]]
// GPU-NEXT: %[[SHIFT:.+]] = vector.extract %[[HEAD_F32]][0] : f32 from vector<8xf32>
// GPU-NEXT: %[[SHIFTS:.+]] = vector.broadcast %[[SHIFT]] : f32 to vector<8xf32>
// GPU: scf.for %{{.+}} iter_args(%{{.+}} = %[[ZERO]], %{{.+}} = %[[ZERO]], %{{.+}} = %[[ZERO]], %{{.+}} = %[[ZERO]]) -> (vector<1xf32>, vector<1xf32>, vector<1xf32>, vector<1xf32>)
// GPU: scf.for %{{.+}} step %c4 iter_args(%[[N_A:.+]] = %[[ZERO]], %[[MEAN_A:.+]] = %[[ZERO]], %[[M2_A:.+]] = %[[ZERO]], %{{.+}} = %[[ZERO]])
// GPU: %[[X:.+]] = arith.extf %{{.+}} : vector<8xbf16> to vector<8xf32>
// GPU: vector.reduction <add>, %[[X]], %{{.+}} fastmath<reassoc> : vector<8xf32> into f32
// GPU-NEXT: %[[XS:.+]] = arith.subf %[[X]], %[[SHIFTS]] : vector<8xf32>
// GPU-NEXT: %[[SCALED:.+]] = arith.mulf %[[XS]], %[[EIGHTH]] : vector<8xf32>
// GPU-NEXT: %[[CHUNK_MEAN:.+]] = vector.reduction <add>, %[[SCALED]], %[[NEG_ZERO]] fastmath<reassoc> : vector<8xf32> into f32
// GPU-NEXT: vector.broadcast %[[CHUNK_MEAN]] : f32 to vector<1xf32>
// GPU-NEXT: %[[MEANS:.+]] = vector.broadcast %[[CHUNK_MEAN]] : f32 to vector<8xf32>
// GPU-NEXT: %[[DEV:.+]] = arith.subf %[[XS]], %[[MEANS]] : vector<8xf32>
// GPU-NEXT: %[[SQ:.+]] = arith.mulf %[[DEV]], %[[DEV]] : vector<8xf32>
// GPU-NEXT: vector.reduction <add>, %[[SQ]], %[[NEG_ZERO]] fastmath<reassoc> : vector<8xf32> into f32
// GPU: %[[N_B:.+]] = arith.addf %[[N_A]], %[[COUNT]] : vector<1xf32>
// GPU-NEXT: %[[DELTA:.+]] = arith.subf %{{.+}}, %[[MEAN_A]] : vector<1xf32>
// GPU-NEXT: %[[AT_LEAST_ONE:.+]] = arith.maximumf %[[N_B]], %{{.+}} : vector<1xf32>
// GPU-NEXT: %[[SHARE:.+]] = arith.divf %[[COUNT]], %[[AT_LEAST_ONE]] : vector<1xf32>
// GPU-COUNT-3: arith.divf %[[COUNT]], %{{.+}} : vector<1xf32>
// GPU-NOT: arith.divf
// GPU: scf.yield %{{.+}}, %{{.+}}, %{{.+}}, %{{.+}} : vector<1xf32>, vector<1xf32>, vector<1xf32>, vector<1xf32>
// GPU: arith.divf %{{.+}}, %{{.+}} : vector<1xf32>
// GPU: gpu.shuffle  xor
// The mean: the sum / n unless the mean is at least 8 times the shifted
// mean plus the spread (sqrt of the variance), then the shift plus that
// mean (after the warps' states are combined; an inf or NaN sum takes the
// shifted mean too). Across the 16 warps: each thread reads one
// warp's 4 values (lane % 16), four butterfly levels merge them (Chan's
// merge, a division each), and every lane takes the first lane's mean, M2
// and sum (the merge is not commutative; the count is not used).
// GPU: gpu.barrier
// GPU-NEXT: arith.remui %{{.+}}, %c16 : index
// GPU-COUNT-4: memref.load %{{.+}} : memref<64xf32, #gpu.address_space<workgroup>>
// GPU-NOT: memref.load
// GPU: gpu.shuffle  xor %{{.+}}, %c1_i32
// GPU-COUNT-3: gpu.shuffle  xor %{{.+}}, %c1_i32
// GPU: arith.divf %{{.+}}, %{{.+}} : f32
// GPU: gpu.shuffle  xor %{{.+}}, %c8_i32
// GPU-COUNT-3: gpu.shuffle  xor %{{.+}}, %c8_i32
// GPU: arith.divf %{{.+}}, %{{.+}} : f32
// GPU-NEXT: arith.mulf
// GPU-NEXT: arith.addf
// GPU: %[[LANE:.+]] = gpu.lane_id
// GPU-NEXT: %[[FIRST:.+]] = arith.andi %[[LANE]], %c-16 : index
// GPU-NEXT: %[[SOURCE:.+]] = arith.index_cast %[[FIRST]] : index to i32
// GPU-NEXT: %[[WELFORD:.+]], %{{.+}} = gpu.shuffle  idx %{{.+}}, %[[SOURCE]], %c32_i32 : f32
// GPU-NEXT: %[[M2:.+]], %{{.+}} = gpu.shuffle  idx %{{.+}}, %[[SOURCE]], %c32_i32 : f32
// GPU-NEXT: %[[SUM:.+]], %{{.+}} = gpu.shuffle  idx %{{.+}}, %[[SOURCE]], %c32_i32 : f32
// GPU-NEXT: gpu.barrier
// GPU-NEXT: %[[SHIFTED:.+]] = arith.addf %[[SHIFT]], %[[WELFORD]] : f32
// GPU-NEXT: %[[SUM_MEAN:.+]] = arith.divf %[[SUM]], %[[N]] : f32
// GPU-NEXT: %[[VARIANCE:.+]] = arith.divf %[[M2]], %[[N]] : f32
// GPU-NEXT: %[[WELFORD_SIZE:.+]] = math.absf %[[WELFORD]] : f32
// GPU-NEXT: %[[SPREAD:.+]] = math.sqrt %[[VARIANCE]] : f32
// GPU-NEXT: %[[SUM_SIZE:.+]] = math.absf %[[SUM_MEAN]] : f32
// GPU-NEXT: %[[SIZES:.+]] = arith.addf %[[WELFORD_SIZE]], %[[SPREAD]] : f32
// GPU-NEXT: %[[BOUND:.+]] = arith.mulf %[[SIZES]], %[[MARGIN]] : f32
// GPU-NEXT: %[[SUM_CLOSER:.+]] = arith.cmpf olt, %[[SUM_SIZE]], %[[BOUND]] : f32
// GPU-NEXT: arith.select %[[SUM_CLOSER]], %[[SUM_MEAN]], %[[SHIFTED]] : f32
// GPU-NEXT: arith.addf %[[VARIANCE]], %{{.+}} : f32
// GPU: scf.for %{{.+}} = %c0 to %c8 step %c1 {
// GPU-COUNT-4: llvm.load %{{.+}} {alignment = 16 : i64} : !llvm.ptr<1> -> vector<8xbf16>
// GPU-NOT: llvm.store
// GPU-COUNT-4: llvm.store %{{.+}} {alignment = 16 : i64} : vector<8xbf16>, !llvm.ptr<1>
// GPU: gpu.return
// At n = 122872 the output pass takes 7 groups of four chunks, then the
// 2 left over in one group more: both loads before either store.
// PARTIAL-LABEL: gpu.func @layer_norm
// PARTIAL: scf.for %{{.+}} = %c0 to %c7 step %c1 {
// PARTIAL-COUNT-4: llvm.load %{{.+}} {alignment = 16 : i64} : !llvm.ptr<1> -> vector<8xbf16>
// PARTIAL-NOT: llvm.store
// PARTIAL-COUNT-4: llvm.store %{{.+}} {alignment = 16 : i64} : vector<8xbf16>, !llvm.ptr<1>
// PARTIAL: }
// PARTIAL-NOT: scf.for
// PARTIAL-COUNT-2: llvm.load %{{.+}} {alignment = 16 : i64} : !llvm.ptr<1> -> vector<8xbf16>
// PARTIAL-NOT: llvm.store
// PARTIAL-COUNT-2: llvm.store %{{.+}} {alignment = 16 : i64} : vector<8xbf16>, !llvm.ptr<1>
// PARTIAL-NOT: llvm.load {{.+}} vector<8xbf16>
// PARTIAL: gpu.return
// CPU-LABEL: func.func @layer_norm
// CPU: scf.for %{{.+}} iter_args(%{{.+}} = %{{.+}}, %{{.+}} = %{{.+}}, %{{.+}} = %{{.+}}, %{{.+}} = %{{.+}}) -> (vector<1xf32>, vector<1xf32>, vector<1xf32>, vector<1xf32>)
// CPU: llvm.load
// CPU: scf.yield
// CPU: llvm.store
// CPU: return
fuse.kernel @layer_norm(%x: !fuse.full<f32>, %eps: !fuse.scalar<f32>) -> (y: !fuse.full<f32>, mean: !fuse.row<f32>) {
  %mean = fuse.reduce mean %x : !fuse.full<f32> to !fuse.row<f32>
  %mean_f = fuse.broadcast %mean : !fuse.row<f32> to !fuse.full<f32>
  %xc = fuse.sub %x, %mean_f : !fuse.full<f32>
  %sq = fuse.mul %xc, %xc : !fuse.full<f32>
  %var = fuse.reduce mean %sq : !fuse.full<f32> to !fuse.row<f32>
  %eps_r = fuse.broadcast %eps : !fuse.scalar<f32> to !fuse.row<f32>
  %v = fuse.add %var, %eps_r : !fuse.row<f32>
  %rstd = fuse.rsqrt %v : !fuse.row<f32>
  %rstd_f = fuse.broadcast %rstd : !fuse.row<f32> to !fuse.full<f32>
  %y = fuse.mul %xc, %rstd_f : !fuse.full<f32>
  fuse.yield %y, %mean : !fuse.full<f32>, !fuse.row<f32>
}
