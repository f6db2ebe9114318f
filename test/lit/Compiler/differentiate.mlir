// RUN: tilefuse-opt %S/../fusions/rms_norm_fwd.mlir -fuse-differentiate=outputs=y | FileCheck %s --check-prefix=RMS
// RUN: tilefuse-opt %S/../fusions/layer_norm_fwd.mlir -fuse-differentiate=outputs=y | FileCheck %s --check-prefix=LN
// RUN: tilefuse-opt %S/../fusions/swiglu_fwd.mlir -fuse-differentiate | FileCheck %s --check-prefix=SWIGLU
// RUN: tilefuse-opt %S/../fusions/cross_entropy_fwd.mlir -fuse-differentiate=outputs=loss | FileCheck %s --check-prefix=CE
// RUN: tilefuse-opt %s -split-input-file -fuse-differentiate | FileCheck %s
// RUN: tilefuse-opt %s -split-input-file -fuse-differentiate | tilefuse-opt -split-input-file | FileCheck %s

// The reference forward fusions: their derived backward kernels take and
// give what the hand-written ones (test/lit/fusions/*_bwd.mlir) do, read
// the statistics the forward saves and reduce as often.

// RMS: fuse.kernel @rms_norm_fwd({{.+}}) -> (y: !fuse.full<f32>, rstd: !fuse.row<f32>)
// RMS: fuse.kernel @rms_norm_bwd(%dy: !fuse.full<f32>, %x: !fuse.full<f32>, %weight: !fuse.col<f32>, %offset: !fuse.scalar<f32>, %rstd: !fuse.row<f32>) -> (dx: !fuse.full<f32>, dweight: !fuse.col<f32>)
// RMS-COUNT-1: fuse.reduce sum %{{.+}} : !fuse.full<f32> to !fuse.row<f32>
// RMS-NOT: fuse.reduce {{.+}} to !fuse.row
// RMS: fuse.reduce sum %{{.+}} : !fuse.full<f32> to !fuse.col<f32>
// RMS-NEXT: fuse.yield

// LN: fuse.kernel @layer_norm_fwd({{.+}}) -> (y: !fuse.full<f32>, mean: !fuse.row<f32>, rstd: !fuse.row<f32>)
// LN: fuse.kernel @layer_norm_bwd(%dy: !fuse.full<f32>, %x: !fuse.full<f32>, %weight: !fuse.col<f32>, %mean: !fuse.row<f32>, %rstd: !fuse.row<f32>) -> (dx: !fuse.full<f32>, dweight: !fuse.col<f32>, dbias: !fuse.col<f32>)
// Two row sums, both of inputs and saved statistics only: one pass.
// LN: %[[G:.+]] = fuse.mul %dy, %{{.+}} : !fuse.full<f32>
// LN: %[[XC:.+]] = fuse.sub %x, %{{.+}} : !fuse.full<f32>
// LN: %[[GXC:.+]] = fuse.mul %[[G]], %[[XC]] : !fuse.full<f32>
// LN: fuse.reduce sum %[[GXC]] : !fuse.full<f32> to !fuse.row<f32>
// sum(x - mean) is the saved mean times n, less itself: exactly 0.
// LN: %[[MEAN_N:.+]] = fuse.mul %mean, %{{.+}} : !fuse.row<f32>
// LN: fuse.reduce sum %[[G]] : !fuse.full<f32> to !fuse.row<f32>
// LN: %[[NEG:.+]] = fuse.neg %[[MEAN_N]] : !fuse.row<f32>
// LN: fuse.add %[[NEG]], %[[MEAN_N]] : !fuse.row<f32>
// LN-NOT: fuse.reduce {{.+}} to !fuse.row
// LN: fuse.reduce sum %{{.+}} : !fuse.full<f32> to !fuse.col<f32>
// LN: fuse.reduce sum %dy : !fuse.full<f32> to !fuse.col<f32>

// SWIGLU: fuse.kernel @swiglu_bwd(%dc: !fuse.full<f32>, %a: !fuse.full<f32>, %b: !fuse.full<f32>) -> (da: !fuse.full<f32>, db: !fuse.full<f32>)
// SWIGLU: fuse.sigmoid %a
// SWIGLU-NOT: fuse.reduce

// The forward also saves the max's argmax and the sum of exponentials (its
// row max is an output already); the backward then reduces nothing:
// sum(exp(x - max)) is the saved sum, so the max's gradient (which
// cancels) is per-row work.
// CE: fuse.kernel @cross_entropy_fwd({{.+}}) -> (loss: !fuse.row<f32>, z_loss: !fuse.row<f32>, max: !fuse.row<f32>, log_sum: !fuse.row<f32>, argmax: !fuse.row<i32>, rowsum: !fuse.row<f32>)
// CE: %[[MAX:.+]] = fuse.reduce max %logits
// CE-NEXT: %[[ARGMAX:.+]] = fuse.arg_reduce max %logits : !fuse.full<f32> to !fuse.row<i32>
// CE: fuse.yield %{{.+}}, %{{.+}}, %[[MAX]], %{{.+}}, %[[ARGMAX]], %{{.+}} :
// CE: fuse.kernel @cross_entropy_bwd(%dloss: !fuse.row<f32>, %logits: !fuse.full<f32>, %target: !fuse.row<i64>, %ignore_index: !fuse.scalar<i64>, %label_smoothing: !fuse.scalar<f32>, %max: !fuse.row<f32>, %argmax: !fuse.row<i32>, %rowsum: !fuse.row<f32>) -> (dlogits: !fuse.full<f32>)
// CE-NOT: fuse.reduce
// The target's one-hot (the gather's adjoint) and the argmax's (i32).
// CE: %[[IOTA:.+]] = fuse.iota : !fuse.col<i64>
// CE: %[[COLUMNS:.+]] = fuse.broadcast %[[IOTA]] : !fuse.col<i64> to !fuse.full<i64>
// CE: fuse.cmp eq, %{{.+}}, %[[COLUMNS]] : !fuse.full<i64>
// CE: fuse.exp
// CE: %[[IOTA32:.+]] = fuse.iota : !fuse.col<i32>
// CE: %[[AT_ARGMAX:.+]] = fuse.broadcast %argmax : !fuse.row<i32> to !fuse.full<i32>
// CE: %[[COLUMNS32:.+]] = fuse.broadcast %[[IOTA32]] : !fuse.col<i32> to !fuse.full<i32>
// CE: fuse.cmp eq, %[[AT_ARGMAX]], %[[COLUMNS32]] : !fuse.full<i32>
// CE-NOT: fuse.reduce
// CE: fuse.yield

// -----

// By default every float output gets a gradient and every full, per-row
// and per-column float input is differentiated; the per-column input's
// gradient is one column sum of its full contributions (a column value's
// adjoint is summed over rows once, at the input); maximum splits ties in
// half; pow's exponent gets a gradient; floor adds none.
// CHECK-LABEL: fuse.kernel @rules(
fuse.kernel @rules(%x: !fuse.full<f32>, %w: !fuse.col<f32>, %r: !fuse.row<f32>, %s: !fuse.scalar<f32>) -> (y: !fuse.full<f32>) {
  %w2 = fuse.mul %w, %w : !fuse.col<f32>
  %wb = fuse.broadcast %w2 : !fuse.col<f32> to !fuse.full<f32>
  %rb = fuse.broadcast %r : !fuse.row<f32> to !fuse.full<f32>
  %m = fuse.maximum %x, %wb : !fuse.full<f32>
  %p = fuse.pow %m, %rb : !fuse.full<f32>
  %f = fuse.floor %x : !fuse.full<f32>
  %y = fuse.add %p, %f : !fuse.full<f32>
  fuse.yield %y : !fuse.full<f32>
}
// CHECK-LABEL: fuse.kernel @rules_bwd(%dy: !fuse.full<f32>, %x: !fuse.full<f32>, %w: !fuse.col<f32>, %r: !fuse.row<f32>) -> (dx: !fuse.full<f32>, dw: !fuse.col<f32>, dr: !fuse.row<f32>)
// CHECK-DAG: %[[HALF:.+]] = fuse.constant full 5.000000e-01 : f32
// CHECK-DAG: %[[ZERO:.+]] = fuse.constant full 0.000000e+00 : f32
// CHECK: %[[M:.+]] = fuse.maximum %x, %[[WB:.+]] : !fuse.full<f32>
// d(base) = where(r == 0, 0, dy * r * m^(r - 1))
// CHECK: %[[DBASE:.+]] = fuse.select %{{.+}}, %[[ZERO]], %{{.+}} : !fuse.full<f32>
// d(exponent) = dy * where(m == 0 & r >= 0, 0, m^r * log(m)), summed per row
// CHECK: fuse.log %[[M]]
// CHECK: %[[DEXP:.+]] = fuse.mul %dy, %{{.+}} : !fuse.full<f32>
// CHECK: %[[DHALF:.+]] = fuse.mul %[[DBASE]], %[[HALF]]
// CHECK: %[[TIE:.+]] = fuse.cmp eq, %x, %[[WB]]
// CHECK: %[[XLOSES:.+]] = fuse.cmp lt, %x, %[[WB]]
// CHECK: %[[KEEP:.+]] = fuse.select %[[XLOSES]], %[[ZERO]], %[[DBASE]]
// CHECK: %[[DX:.+]] = fuse.select %[[TIE]], %[[DHALF]], %[[KEEP]]
// CHECK: %[[DR:.+]] = fuse.reduce sum %[[DEXP]] : !fuse.full<f32> to !fuse.row<f32>
// CHECK: %[[DW:.+]] = fuse.reduce sum %{{.+}} : !fuse.full<f32> to !fuse.col<f32>
// CHECK: fuse.yield %[[DX]], %[[DW]], %[[DR]]

// -----

// A row max sends its gradient to the first maximal column (the argmax the
// forward saves and appends to its outputs), a gather to its column, a
// select to the chosen side. Nothing needs x itself: the backward does not
// read it.
// CHECK-LABEL: fuse.kernel @routing(
// CHECK-SAME: -> (out: !fuse.row<f32>, argmax: !fuse.row<i32>)
// CHECK: %[[MAX:.+]] = fuse.reduce max %x
// CHECK-NEXT: %[[ARG:.+]] = fuse.arg_reduce max %x
// CHECK: fuse.yield %{{.+}}, %[[ARG]]
fuse.kernel @routing(%x: !fuse.full<f32>, %t: !fuse.row<i32>, %c: !fuse.row<f32>) -> (out: !fuse.row<f32>) {
  %max = fuse.reduce max %x : !fuse.full<f32> to !fuse.row<f32>
  %picked = fuse.gather %x[%t] : !fuse.full<f32>, !fuse.row<i32> -> !fuse.row<f32>
  %zero = fuse.constant row 0.000000e+00 : f32
  %positive = fuse.cmp gt, %c, %zero : !fuse.row<f32>
  %chosen = fuse.select %positive, %max, %picked : !fuse.row<f32>
  fuse.yield %chosen : !fuse.row<f32>
}
// CHECK-LABEL: fuse.kernel @routing_bwd(%dout: !fuse.row<f32>, %t: !fuse.row<i32>, %c: !fuse.row<f32>, %argmax: !fuse.row<i32>) -> (dx: !fuse.full<f32>, dc: !fuse.row<f32>)
// CHECK-DAG: %[[ZERO_FULL:.+]] = fuse.constant full 0.000000e+00 : f32
// CHECK-DAG: %[[ZERO:.+]] = fuse.constant row 0.000000e+00 : f32
// CHECK: %[[POSITIVE:.+]] = fuse.cmp gt, %c, %[[ZERO]]
// CHECK: %[[TO_MAX:.+]] = fuse.select %[[POSITIVE]], %dout, %[[ZERO]] : !fuse.row<f32>
// CHECK: %[[TO_PICKED:.+]] = fuse.select %[[POSITIVE]], %[[ZERO]], %dout : !fuse.row<f32>
// CHECK: %[[COLUMN32:.+]] = fuse.iota : !fuse.col<i32>
// CHECK: %[[T:.+]] = fuse.broadcast %t : !fuse.row<i32> to !fuse.full<i32>
// CHECK: %[[COLUMNS32:.+]] = fuse.broadcast %[[COLUMN32]] : !fuse.col<i32> to !fuse.full<i32>
// CHECK: %[[AT_T:.+]] = fuse.cmp eq, %[[T]], %[[COLUMNS32]] : !fuse.full<i32>
// CHECK: %[[PICKED:.+]] = fuse.broadcast %[[TO_PICKED]]
// CHECK: %[[DGATHER:.+]] = fuse.select %[[AT_T]], %[[PICKED]], %[[ZERO_FULL]] : !fuse.full<f32>
// CHECK: %[[ARG:.+]] = fuse.broadcast %argmax : !fuse.row<i32> to !fuse.full<i32>
// CHECK: %[[AT_ARG:.+]] = fuse.cmp eq, %[[ARG]], %[[COLUMNS32]] : !fuse.full<i32>
// CHECK: %[[MAXED:.+]] = fuse.broadcast %[[TO_MAX]]
// CHECK: %[[DMAX:.+]] = fuse.select %[[AT_ARG]], %[[MAXED]], %[[ZERO_FULL]] : !fuse.full<f32>
// CHECK: %[[DX:.+]] = fuse.add %[[DGATHER]], %[[DMAX]] : !fuse.full<f32>
// The selector has no gradient: dc is zero.
// CHECK: fuse.yield %[[DX]], %[[ZERO]] : !fuse.full<f32>, !fuse.row<f32>

// -----

// A 16-bit column's gradient sums the rows in the compute type and rounds
// once (rounding each term first loses ~sqrt(rows) ulps).
// CHECK-LABEL: fuse.kernel @scale_bf16_bwd
// CHECK: %[[SUM:.+]] = fuse.reduce sum %{{.+}} : !fuse.full<f32> to !fuse.col<f32>
// CHECK-NEXT: %[[DW:.+]] = fuse.cast %[[SUM]] : !fuse.col<f32> to !fuse.col<bf16>
// CHECK-NEXT: fuse.yield %{{.+}}, %[[DW]] : !fuse.full<bf16>, !fuse.col<bf16>
fuse.kernel @scale_bf16(%x: !fuse.full<bf16>, %w: !fuse.col<bf16>) -> (y: !fuse.full<bf16>) {
  %0 = fuse.cast %x : !fuse.full<bf16> to !fuse.full<f32>
  %1 = fuse.cast %w : !fuse.col<bf16> to !fuse.col<f32>
  %2 = fuse.broadcast %1 : !fuse.col<f32> to !fuse.full<f32>
  %3 = fuse.mul %2, %0 : !fuse.full<f32>
  %4 = fuse.cast %3 : !fuse.full<f32> to !fuse.full<bf16>
  fuse.yield %4 : !fuse.full<bf16>
}
