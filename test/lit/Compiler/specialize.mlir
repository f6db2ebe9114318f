// RUN: tilefuse-opt %s -split-input-file --pass-pipeline='builtin.module(fuse.kernel(fuse-specialize{dtype=bf16 n=4096}))' | FileCheck %s
// RUN: tilefuse-opt %s -split-input-file --pass-pipeline='builtin.module(fuse.kernel(fuse-specialize{dtype=f32 n=7 aligned=false}))' | FileCheck %s --check-prefix=F32
// RUN: tilefuse-opt %s -split-input-file --pass-pipeline='builtin.module(fuse.kernel(fuse-specialize{dtype=declared n=64}))' | FileCheck %s --check-prefix=DECLARED

// Full and per-column floats are stored in the dtype and widened to the
// declared compute type; per-row statistics, integer indices and scalars
// keep their types; row_length becomes n.

// CHECK-LABEL: fuse.kernel @norm
// CHECK-SAME: (%x: !fuse.full<bf16>, %w: !fuse.col<bf16>, %t: !fuse.row<i64>, %s: !fuse.scalar<f32>)
// CHECK-SAME: -> (y: !fuse.full<bf16>, stat: !fuse.row<f32>, dw: !fuse.col<bf16>)
// CHECK-SAME: attributes {fuse.specialization = {aligned = true, dtype = bf16, n = 4096 : i64}}
// CHECK: %[[X:.+]] = fuse.cast %x : !fuse.full<bf16> to !fuse.full<f32>
// CHECK: %[[W:.+]] = fuse.cast %w : !fuse.col<bf16> to !fuse.col<f32>
// CHECK: %[[WF:.+]] = fuse.broadcast %[[W]]
// CHECK: %[[Y:.+]] = fuse.mul %[[X]], %[[WF]] : !fuse.full<f32>
// CHECK: %[[STAT:.+]] = fuse.reduce sum %[[Y]] : !fuse.full<f32> to !fuse.row<f32>
// CHECK: %[[DW:.+]] = fuse.reduce sum %[[Y]] : !fuse.full<f32> to !fuse.col<f32>
// CHECK: %[[N:.+]] = fuse.constant scalar 4.096000e+03 : f32
// CHECK: %[[NR:.+]] = fuse.broadcast %[[N]]
// CHECK: fuse.div %[[STAT]], %[[NR]]
// CHECK: %[[YS:.+]] = fuse.cast %[[Y]] : !fuse.full<f32> to !fuse.full<bf16>
// CHECK: %[[DWS:.+]] = fuse.cast %[[DW]] : !fuse.col<f32> to !fuse.col<bf16>
// CHECK: fuse.yield %[[YS]], %{{.+}}, %[[DWS]] : !fuse.full<bf16>, !fuse.row<f32>, !fuse.col<bf16>

// F32-LABEL: fuse.kernel @norm
// F32-SAME: (%x: !fuse.full<f32>, %w: !fuse.col<f32>, %t: !fuse.row<i64>, %s: !fuse.scalar<f32>)
// F32-SAME: attributes {fuse.specialization = {aligned = false, dtype = f32, n = 7 : i64}}
// F32-NOT: fuse.cast
// F32: fuse.constant scalar 7.000000e+00 : f32
fuse.kernel @norm(%x: !fuse.full<f32>, %w: !fuse.col<f32>, %t: !fuse.row<i64>, %s: !fuse.scalar<f32>) -> (y: !fuse.full<f32>, stat: !fuse.row<f32>, dw: !fuse.col<f32>) {
  %wf = fuse.broadcast %w : !fuse.col<f32> to !fuse.full<f32>
  %y = fuse.mul %x, %wf : !fuse.full<f32>
  %stat = fuse.reduce sum %y : !fuse.full<f32> to !fuse.row<f32>
  %dw = fuse.reduce sum %y : !fuse.full<f32> to !fuse.col<f32>
  %n = fuse.row_length : !fuse.scalar<f32>
  %nr = fuse.broadcast %n : !fuse.scalar<f32> to !fuse.row<f32>
  %mean = fuse.div %stat, %nr : !fuse.row<f32>
  fuse.yield %y, %mean, %dw : !fuse.full<f32>, !fuse.row<f32>, !fuse.col<f32>
}

// -----

// dtype=declared: every port keeps its declared type (a bf16 input, an f32
// weight, an f32 output); the narrowest, bf16, sets the vector width.
// DECLARED-LABEL: fuse.kernel @mixed
// DECLARED-SAME: (%x: !fuse.full<bf16>, %w: !fuse.col<f32>) -> (y: !fuse.full<f32>, z: !fuse.full<bf16>)
// DECLARED-SAME: attributes {fuse.specialization = {aligned = true, dtype = bf16, n = 64 : i64}}
// DECLARED-NOT: fuse.cast %w
fuse.kernel @mixed(%x: !fuse.full<bf16>, %w: !fuse.col<f32>) -> (y: !fuse.full<f32>, z: !fuse.full<bf16>) {
  %xf = fuse.cast %x : !fuse.full<bf16> to !fuse.full<f32>
  %wf = fuse.broadcast %w : !fuse.col<f32> to !fuse.full<f32>
  %y = fuse.mul %xf, %wf : !fuse.full<f32>
  %z = fuse.cast %y : !fuse.full<f32> to !fuse.full<bf16>
  fuse.yield %y, %z : !fuse.full<f32>, !fuse.full<bf16>
}
